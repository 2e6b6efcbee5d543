"""Our drafters inside TensorRT-LLM's PyTorch flow: a ``Drafter``
(``tensorrt_llm._torch.speculative.drafter``) passed as ``UserProvidedDecodingConfig(drafter=...)``.

Each iteration that speculates, TensorRT-LLM's executor calls ``prepare_draft_tokens(scheduled_requests,
resource_manager)`` for the whole batch, then pads every generation request's ``py_draft_tokens`` with token
0 up to ``max_total_draft_tokens`` (= ``max_draft_len``): the target verifies ``max_draft_len + 1`` positions
per request whatever we draft, so a shorter draft saves no target compute, it only proposes less.

Per generation request (an ``LlmRequest``: ``request_id``, ``py_client_id``, ``get_tokens(0)``,
``py_orig_prompt_len``, ``py_max_new_tokens``), the draft is, in order:

1. the request's prediction (Predicted Outputs, core/prediction.py: the cursor, re-alignment and window of
   our own loop), when the serving layer registered one under the request's LLM API id (``py_client_id``)
   in :class:`RequestHints`;
2. prompt lookup with our incremental n-gram index (core/drafters.py), when the method is promptLookup;

capped at the request's own ``speculation.max_draft_len`` (0: no draft), at what it may still generate, and
at the executor's current ``max_total_draft_tokens`` (newer releases shrink it by ``draft_len_schedule``).
What the previous draft had accepted is read from the tokens the request gained since (common prefix).

:class:`RequestHints` is process-local: the drafter object is pickled into TensorRT-LLM's worker process
unless ``TLLM_WORKER_USE_SINGLE_PROCESS=1``, and a copy there sees no registrations. So predictions and
per-request caps are offered only in single-process mode (:func:`hints_reach_the_drafter`); prompt lookup
works either way. A request's drafting state is dropped when it has not been scheduled for
``STALE_CALLS`` calls (and rebuilt from its tokens if it comes back): no resource manager is needed.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from specdeploy_server.core.acceptance import accepted_prefix
from specdeploy_server.core.drafters import NgramIndex
from specdeploy_server.core.prediction import PredictionAlignment
from specdeploy_server.core.types import RequestSpeculation

log = logging.getLogger(__name__)

#: where TensorRT-LLM's ``Drafter`` base class lives (1.0 on)
DRAFTER_MODULE = "tensorrt_llm._torch.speculative.drafter"
#: the environment variable that keeps TensorRT-LLM's executor in the server's process
SINGLE_PROCESS_ENV = "TLLM_WORKER_USE_SINGLE_PROCESS"
#: a request not scheduled for this many calls has its drafting state dropped
STALE_CALLS = 64


def hints_reach_the_drafter() -> bool:
    """Whether TensorRT-LLM runs its executor (and so our drafter) in this process."""
    return os.environ.get(SINGLE_PROCESS_ENV) == "1"


class RequestHints:
    """Per-request speculation (prediction, draft-length cap) by LLM API request id, registered by the
    serving layer when a request is submitted and dropped when it ends; the drafter adds what it drafted for
    each (the request's acceptance figures). Pickles by name: a copy in the same process is the same channel,
    one in another process a new, empty one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._by_client: dict[int, RequestSpeculation] = {}
        #: the drafts taken from a request's prediction, by the token count they were drafted at
        self._predicted: dict[int, dict[int, list[int]]] = {}
        #: the draft tokens the drafter proposed for each request (before TensorRT-LLM pads them)
        self._drafted: dict[int, int] = {}

    def register(self, client_id: int, speculation: RequestSpeculation) -> None:
        self._by_client[client_id] = speculation
        self._predicted[client_id] = {}
        self._drafted[client_id] = 0

    def drop(self, client_id: int) -> None:
        self._by_client.pop(client_id, None)
        self._predicted.pop(client_id, None)
        self._drafted.pop(client_id, None)

    def record_drafted(self, client_id: int, tokens: int) -> None:
        """The drafter proposed ``tokens`` draft tokens for the request in one iteration."""
        if client_id in self._drafted:
            self._drafted[client_id] += tokens

    def drafted(self, client_id: int) -> int | None:
        """The draft tokens proposed for a registered request so far (None for one not registered)."""
        return self._drafted.get(client_id)

    def record_prediction_draft(self, client_id: int, at_len: int, draft: list[int]) -> None:
        """The drafter proposed ``draft`` from the request's prediction when it had ``at_len`` tokens."""
        drafts = self._predicted.get(client_id)
        if drafts is not None:
            drafts[at_len] = draft

    def prediction_accepted(self, client_id: int, at_len: int, new_tokens: Sequence[int]) -> int:
        """Of the tokens a request gained from ``at_len`` on, those that were accepted from a prediction draft
        (for the response's ``accepted_prediction_tokens``); forgets the drafts up to ``at_len``."""
        drafts = self._predicted.get(client_id)
        if not drafts:
            return 0
        draft = drafts.pop(at_len, None)
        for stale in [n for n in drafts if n < at_len]:
            del drafts[stale]
        if draft is None:
            return 0
        return min(accepted_prefix(draft, new_tokens), max(len(new_tokens) - 1, 0))

    def get(self, client_id: int) -> RequestSpeculation | None:
        return self._by_client.get(client_id)

    def __len__(self) -> int:
        return len(self._by_client)

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (request_hints, (self.name,))


_CHANNELS: dict[str, RequestHints] = {}


def request_hints(name: str) -> RequestHints:
    """This process's channel of that name."""
    return _CHANNELS.setdefault(name, RequestHints(name))


@dataclass
class _Track:
    """One request's drafting state."""

    index: NgramIndex | None
    alignment: PredictionAlignment | None = None
    seen: int = 0  # its token count when it was last drafted for
    draft: list[int] = field(default_factory=list)
    from_prediction: bool = False
    limit: int = 0
    last_call: int = 0


class DraftingLogic:
    """``prepare_draft_tokens`` of our drafter; :func:`drafter_class` puts TensorRT-LLM's ``Drafter`` under
    it."""

    def __init__(
        self,
        *,
        max_draft_len: int,
        prompt_lookup_ngram: int | None,
        hints: RequestHints | None = None,
        max_concurrency: int | None = None,
        draft_len_schedule: dict[int, int] | None = None,
    ) -> None:
        if max_draft_len <= 0:
            raise ValueError(f"max_draft_len must be > 0, got {max_draft_len}")
        if prompt_lookup_ngram is not None and prompt_lookup_ngram < 1:
            raise ValueError(f"max_matching_ngram_size must be >= 1, got {prompt_lookup_ngram}")
        wanted: dict[str, Any] = {
            "max_draft_len": max_draft_len,
            "max_total_draft_tokens": max_draft_len,  # linear drafts
            "max_concurrency": max_concurrency,
            "draft_len_schedule": draft_len_schedule,
        }
        base_init = super().__init__
        mro = type(self).__mro__
        accepted: set[str] = set()
        if mro[mro.index(DraftingLogic) + 1] is not object:  # TensorRT-LLM's Drafter under us
            parameters = inspect.signature(base_init).parameters
            takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
            accepted = set(wanted) if takes_any else set(parameters)
        for name in ("max_concurrency", "draft_len_schedule"):
            if wanted[name] is not None and name not in accepted:
                log.warning("this TensorRT-LLM's Drafter takes no %s: it is not honoured", name)
        cast(Any, base_init)(**{k: v for k, v in wanted.items() if k in accepted and v is not None})
        self.draft_len_limit = max_draft_len
        self.prompt_lookup_ngram = prompt_lookup_ngram
        self.hints = hints
        self._tracks: dict[int, _Track] = {}
        self._calls = 0
        #: what this drafter proposed and what of it was accepted (prediction: the part from predictions)
        self.drafted = self.accepted = self.prediction_drafted = self.prediction_accepted = 0

    # TensorRT-LLM's interface ----------------------------------------------------------------
    def prepare_draft_tokens(self, scheduled_requests: Any, resource_manager: Any = None) -> None:
        self._calls += 1
        # newer releases shrink max_total_draft_tokens per batch size (draft_len_schedule)
        width = min(self.draft_len_limit, int(getattr(self, "max_total_draft_tokens", self.draft_len_limit)))
        for request in scheduled_requests.generation_requests:
            request.py_draft_tokens = self._draft(request, width)
            if self.hints is not None:
                self.hints.record_drafted(request.py_client_id, len(request.py_draft_tokens))
        for request_id in [r for r, t in self._tracks.items() if self._calls - t.last_call > STALE_CALLS]:
            del self._tracks[request_id]

    # ------------------------------------------------------------------------------------------
    def _draft(self, request: Any, width: int) -> list[int]:
        tokens: Sequence[int] = request.get_tokens(0)  # a new list per call (the binding copies)
        prompt_len = int(request.py_orig_prompt_len)
        track = self._tracks.get(request.request_id)
        if track is None:
            ngram = self.prompt_lookup_ngram
            track = self._tracks[request.request_id] = _Track(NgramIndex(ngram) if ngram else None)
        else:
            self._observe(track, tokens[track.seen :])
        track.last_call, track.seen, track.draft, track.from_prediction = self._calls, len(tokens), [], False
        hint = self.hints.get(request.py_client_id) if self.hints is not None else None
        generated = len(tokens) - prompt_len
        room = int(request.py_max_new_tokens) - generated - 1
        k = min(width, room)
        if hint is not None and hint.max_draft_len is not None:
            k = min(k, hint.max_draft_len)
        if k <= 0:
            return []
        if hint is not None and hint.prediction:
            if track.alignment is None:
                track.alignment = PredictionAlignment(list(hint.prediction))
            start = track.alignment.position(tokens[prompt_len:])
            if start is not None and start < len(track.alignment.tokens):
                draft = track.alignment.tokens[start : start + min(k, track.alignment.window)]
                track.draft, track.from_prediction, track.limit = draft, True, k
                if self.hints is not None:
                    self.hints.record_prediction_draft(request.py_client_id, len(tokens), list(draft))
                self.prediction_drafted += len(draft)
                self.drafted += len(draft)
                return list(draft)
        if track.index is not None:
            track.index.update(tokens)
            track.draft = track.index.lookup(tokens, k)
            self.drafted += len(track.draft)
        return list(track.draft)

    def _observe(self, track: _Track, new_tokens: Sequence[int]) -> None:
        """The tokens a request gained since its last draft: that draft's accepted part, then one more."""
        if not track.draft:
            return
        accepted = min(accepted_prefix(track.draft, new_tokens), max(len(new_tokens) - 1, 0))
        self.accepted += accepted
        if track.from_prediction and track.alignment is not None:
            self.prediction_accepted += accepted
            track.alignment.observe(len(track.draft), accepted, track.limit)


def drafter_base() -> type | None:
    """TensorRT-LLM's ``Drafter`` (None where the installed version has none)."""
    try:
        module = importlib.import_module(DRAFTER_MODULE)
    except ImportError:
        return None
    base = getattr(module, "Drafter", None)
    return base if isinstance(base, type) else None


_CLASSES: dict[type, type] = {}


def drafter_class() -> type:
    """``LlmApiDrafter``: :class:`DraftingLogic` over the installed ``Drafter``, importable by that name from
    this module (so that pickling it into TensorRT-LLM's worker process finds it there)."""
    base = drafter_base()
    if base is None:
        raise ImportError(f"{DRAFTER_MODULE}.Drafter is not available")
    cls = _CLASSES.get(base)
    if cls is None:
        # the newest releases want this on a drafter used with the default TorchSampler
        members: dict[str, Any] = {"__module__": __name__, "__qualname__": "LlmApiDrafter"}
        members["_needs_padding_kv_extension"] = True
        cls = _CLASSES[base] = type("LlmApiDrafter", (DraftingLogic, base), members)
    return cls


def __getattr__(name: str) -> Any:
    if name == "LlmApiDrafter":
        return drafter_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
