"""The double of TensorRT-LLM's drafting interface in the PyTorch flow: ``Drafter``
(``tensorrt_llm._torch.speculative.drafter``), ``LlmRequest``, ``ScheduledRequests``,
``UserProvidedDecodingConfig`` and an executor loop (``PyExecutor``) that drafts, pads and verifies greedily
with a tiny test model, as docs/trtllm.md ("Drafting inside the PyTorch flow") describes the real one.

What it models: ``Drafter.__init__`` in two versions (:class:`Drafter`: ``max_draft_len,
max_total_draft_tokens, max_concurrency=None, draft_len_schedule=None``; :class:`DrafterV10`: 1.0-era,
``max_concurrency`` only) with the abstract
``prepare_draft_tokens(scheduled_requests, resource_manager=None)``;
``should_use_spec_decode`` (off above ``max_concurrency`` active requests; with a schedule, off where it gives
0, and ``max_total_draft_tokens`` set from it in the version's meaning); ``UserProvidedDecodingConfig``
(extra fields forbidden, ``max_draft_len > 0``, a drafter required, ``max_total_draft_tokens`` forced to
``max_draft_len``); each speculating iteration calls ``prepare_draft_tokens`` on the scheduled batch, refuses
a draft longer than ``max_total_draft_tokens``, pads every generation request's ``py_draft_tokens`` with
token 0 up to it, and the target verifies every padded position (a padded 0 the target also picks counts as
accepted, as it would there); the drafter is a pickled copy unless ``TLLM_WORKER_USE_SINGLE_PROCESS=1``.

Differences from the real classes, and why:

1. No KV cache, CUDA graphs or in-flight batching cost: each request's prefix is re-run per iteration (the
   tests need outputs and counts, not speed); verification is greedy only (our drafter's tests are greedy).
2. A request's first iteration is its context step (one token, no draft), as there; chunked prefill, paused
   requests and a resource manager are not modelled (our drafter passes none).
3. The "worker process" is a pickled copy of the drafter in the same process: a registry the copy looks up
   by name in its module is the same one here, while in a real second process it would be empty. Our code
   therefore passes no prediction channel unless single-process mode is set.
4. ``LlmRequest`` has only the fields our drafter reads (``request_id``, ``py_client_id``, ``get_tokens(0)``,
   ``py_orig_prompt_len``, ``py_max_new_tokens``, ``py_draft_tokens``, ``state``).
5. ``max_draft_len`` against an over-long draft: the double raises ``ValueError``; what the real executor does
   then (fail or truncate) was not read.
"""

from __future__ import annotations

import bisect
import os
import pickle
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import torch

from tests.server.trtllm_double_configs import LOAD_AWARE, base_fields, config_model

SINGLE_PROCESS_ENV = "TLLM_WORKER_USE_SINGLE_PROCESS"


@dataclass
class LlmRequest:
    request_id: int
    py_client_id: int
    tokens: list[int]
    py_orig_prompt_len: int
    py_max_new_tokens: int
    py_draft_tokens: list[int] = field(default_factory=list)
    state: str = "CONTEXT_INIT"

    def get_tokens(self, beam: int) -> list[int]:
        if beam != 0:
            raise IndexError("beam width is 1")
        return list(self.tokens)


@dataclass
class ScheduledRequests:
    context_requests: list[LlmRequest] = field(default_factory=list)
    generation_requests: list[LlmRequest] = field(default_factory=list)


class Drafter(ABC):
    """The newer base: the executor reads ``max_concurrency`` and ``draft_len_schedule`` from the drafter.
    ``schedule_meaning``: ``lower`` (keys are lower bounds, 1.2) or ``upper`` (upper bounds, newer)."""

    schedule_meaning = "lower"

    def __init__(
        self,
        max_draft_len: int,
        max_total_draft_tokens: int,
        max_concurrency: int | None = None,
        draft_len_schedule: dict[int, int] | None = None,
    ) -> None:
        lower = draft_len_schedule is not None and self.schedule_meaning == "lower"
        if lower and draft_len_schedule is not None and draft_len_schedule.get(1) != max_draft_len:
            raise ValueError("draft_len_schedule must contain {1: max_draft_len}")
        self.max_draft_len = max_draft_len
        self.max_total_draft_tokens = max_total_draft_tokens
        self._static_max_total = max_total_draft_tokens
        self.max_concurrency = max_concurrency
        self.draft_len_schedule = draft_len_schedule

    @abstractmethod
    def prepare_draft_tokens(
        self, scheduled_requests: ScheduledRequests, resource_manager: Any = None
    ) -> None:
        raise NotImplementedError

    def draft_len_for_batch_size(self, batch: int) -> int:
        schedule = self.draft_len_schedule
        if not schedule:
            return self._static_max_total
        keys = sorted(schedule)
        if self.schedule_meaning == "lower":
            at = bisect.bisect_right(keys, batch) - 1
            return schedule[keys[at]] if at >= 0 else self._static_max_total
        at = bisect.bisect_left(keys, batch)
        return schedule[keys[at]] if at < len(keys) else 0

    def should_use_spec_decode(self, requests: list[LlmRequest]) -> bool:
        if self.max_concurrency is not None and len(requests) > self.max_concurrency:
            return False
        length = self.draft_len_for_batch_size(len(requests))
        self.max_total_draft_tokens = length  # update_max_total_draft_tokens
        return length > 0

    def padded_width(self) -> int:
        """What the target verifies per request: lower meaning, the static maximum (only the drafter
        shortens); upper meaning, the schedule's length."""
        return self._static_max_total if self.schedule_meaning == "lower" else self.max_total_draft_tokens


class DrafterV10(ABC):
    """The 1.0-era base: ``max_concurrency`` only."""

    def __init__(self, max_concurrency: int | None = None) -> None:
        self.max_concurrency = max_concurrency

    @abstractmethod
    def prepare_draft_tokens(
        self, scheduled_requests: ScheduledRequests, resource_manager: Any = None
    ) -> None:
        raise NotImplementedError

    def should_use_spec_decode(self, requests: list[LlmRequest]) -> bool:
        return self.max_concurrency is None or len(requests) <= self.max_concurrency


def padded_width(drafter: Any, spec: Any) -> int:
    """The padded draft width of an iteration (the 1.0-era base: the config's max_total_draft_tokens)."""
    return int(drafter.padded_width()) if isinstance(drafter, Drafter) else int(spec.max_total_draft_tokens)


def _user_provided(config: Any) -> str | None:
    if config.max_draft_len is None or config.max_draft_len <= 0:
        return f"max_draft_len must be > 0, got {config.max_draft_len}"
    if not isinstance(config.drafter, Drafter | DrafterV10):
        return f"drafter must be a Drafter, got {type(config.drafter).__name__}"
    config.max_total_draft_tokens = config.max_draft_len  # linear drafts only
    return base_fields(config)


UserProvidedDecodingConfig = config_model(
    "UserProvidedDecodingConfig",
    **LOAD_AWARE,
    check=_user_provided,
    max_draft_len=None,
    max_total_draft_tokens=None,
    drafter=None,
    resource_manager=None,
)


def worker_drafter(drafter: Any) -> Any:
    """The drafter the executor uses: the object itself in single-process mode, else a pickled copy."""
    if os.environ.get(SINGLE_PROCESS_ENV) == "1":
        return drafter
    return pickle.loads(pickle.dumps(drafter))


@dataclass
class IterationRecord:
    active: int  # active requests when it was scheduled
    width: int  # padded draft width (0: not speculating)
    drafted: int  # draft tokens the drafter gave (before padding)
    verified: int  # positions the target verified (padded)
    accepted: int


class PyExecutor:
    """Runs requests to completion, iteration by iteration, with a user-provided drafter."""

    def __init__(self, model: Any, spec: Any, *, max_batch_size: int, end_id: int | None = None) -> None:
        self.model = model
        self.spec = spec
        self.drafter = worker_drafter(spec.drafter) if spec is not None else None
        self.max_batch_size = max_batch_size
        self.end_id = end_id
        self.active: list[LlmRequest] = []
        self.done: dict[int, list[int]] = {}
        self.iterations: list[IterationRecord] = []
        self._next = 1

    def add_request(self, client_id: int, prompt: list[int], max_new_tokens: int) -> int:
        request = LlmRequest(self._next, client_id, list(prompt), len(prompt), max_new_tokens)
        self._next += 1
        self.active.append(request)
        return request.request_id

    def run(self) -> dict[int, list[int]]:
        """Every request's generated tokens, by request id."""
        while self.active:
            self.step()
        return self.done

    @torch.inference_mode()
    def step(self) -> None:
        batch = self.active[: self.max_batch_size]
        context = [r for r in batch if r.state == "CONTEXT_INIT"]
        generation = [r for r in batch if r.state != "CONTEXT_INIT"]
        width = 0
        drafted = 0
        if generation and self.drafter is not None and self.drafter.should_use_spec_decode(self.active):
            self.drafter.prepare_draft_tokens(ScheduledRequests(context, generation), None)
            asked = getattr(self.drafter, "max_total_draft_tokens", self.spec.max_total_draft_tokens)
            width = padded_width(self.drafter, self.spec)
            for r in generation:
                if len(r.py_draft_tokens) > asked:
                    raise ValueError(
                        f"{len(r.py_draft_tokens)} draft tokens > max_total_draft_tokens {width}"
                    )
                drafted += len(r.py_draft_tokens)
                r.py_draft_tokens = list(r.py_draft_tokens) + [0] * (width - len(r.py_draft_tokens))
        accepted = 0
        active = len(self.active)
        for r in context:
            self._emit(r, [self._greedy(r.tokens)[-1]])
            r.state = "GENERATION_IN_PROGRESS"
        for r in generation:
            draft = r.py_draft_tokens if width else []
            picks = self._greedy(r.tokens + draft)[len(r.tokens) - 1 :]
            out: list[int] = []
            for i, token in enumerate(draft):
                out.append(picks[i])
                if picks[i] != token or picks[i] == self.end_id:
                    break
            else:
                out.append(picks[len(draft)])
            accepted += len(out) - 1
            r.py_draft_tokens = []
            self._emit(r, out)
        verified = len(generation) * (width + 1)
        self.iterations.append(IterationRecord(active, width, drafted, verified, accepted))

    def _greedy(self, ids: list[int]) -> list[int]:
        return [int(t) for t in self.model(torch.tensor([ids])).logits[0].argmax(-1)]

    def _emit(self, request: LlmRequest, tokens: list[int]) -> None:
        room = request.py_max_new_tokens - (len(request.tokens) - request.py_orig_prompt_len)
        tokens = tokens[:room]
        if self.end_id is not None and self.end_id in tokens:
            tokens = tokens[: tokens.index(self.end_id) + 1]
            room = len(tokens)
        request.tokens.extend(tokens)
        if len(tokens) >= room:
            request.state = "GENERATION_COMPLETE"
            self.active.remove(request)
            self.done[request.request_id] = request.tokens[request.py_orig_prompt_len :]
