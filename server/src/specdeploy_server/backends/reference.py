"""Reference backend: Hugging Face transformers + PyTorch, CPU or CUDA.

Each model keeps one ``DynamicCache`` per request plus the list of tokens that cache holds. Before every
forward
the cache is cut back to the longest common prefix with the sequence, which is how rejected draft tokens
leave the
cache ("trim on rejection") without the core having to say so.

Sequences of a batch are run one after another on a single worker thread (no padding/batching of different
lengths), interleaved step by step across requests. The event loop is never blocked.

Lifecycle rules (core/executors.py): a failure of one sequence's forward is reported for that sequence
(``RequestErrors``), the batch's other sequences are unaffected; the worker skips a sequence aborted before it
reached it; ``release`` runs on the worker thread itself, after whatever call is queued before it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM, DynamicCache

from specdeploy_server.core.acceptance import (
    accept_rejection_sampling,
    accept_token_match,
    sample_from,
)
from specdeploy_server.core.executors import (
    AcceptanceRule,
    DraftRequest,
    ExecutorError,
    RequestErrors,
    VerifyRequest,
)
from specdeploy_server.core.logits import (
    draft_with_forced,
    process_logits,
    target_logits,
    token_logprobs,
)
from specdeploy_server.core.types import (
    FloatArray,
    Proposal,
    SamplingParams,
    SequenceState,
    TokenLogprob,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

_DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}


def resolve_device(kind: str, device_ids: Sequence[int]) -> torch.device:
    if kind == "cpu" or (kind == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if len(device_ids) > 1:
        log.warning("the reference backend runs each model on one device; using cuda:%d", device_ids[0])
    return torch.device("cuda", device_ids[0] if device_ids else 0)


def resolve_dtype(name: str, device: torch.device) -> torch.dtype | str:
    if name != "auto":
        return _DTYPES[name]
    return torch.float32 if device.type == "cpu" else "auto"


def max_position_embeddings(path: Path) -> int | None:
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    value = getattr(config, "max_position_embeddings", None)
    return int(value) if value is not None else None


@dataclass
class _KV:
    cache: Any  # DynamicCache
    tokens: list[int] = field(default_factory=list)  # what the cache holds, position by position
    confirmed: int = 0  # tokens[:confirmed] is known to be a prefix of the request's sequence


class CachedModel:
    """A causal LM with per-request KV caches, trimmed to the longest common prefix before each forward."""

    def __init__(self, path: Path, device: torch.device, dtype: torch.dtype | str) -> None:
        self.path = path
        self.device = device
        model: Any = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=dtype)
        self.model: Any = model.to(device).eval()
        self.vocab_size = int(self.model.config.vocab_size)
        self._kv: dict[str, _KV] = {}

    def release(self, request_id: str) -> None:
        self._kv.pop(request_id, None)

    def cached_tokens(self, request_id: str) -> int:
        kv = self._kv.get(request_id)
        return 0 if kv is None else int(kv.cache.get_seq_length())

    @torch.inference_mode()
    def logits_for(self, request_id: str, prefix: Sequence[int], extra: Sequence[int]) -> torch.Tensor:
        """Logits (float32, on CPU) for the last ``len(extra) + 1`` positions of ``prefix + extra``.

        Row i predicts the token after ``prefix + extra[:i]``.
        """
        kv = self._kv.get(request_id)
        if kv is None:
            kv = self._kv[request_id] = _KV(DynamicCache(config=self.model.config))
        full = [*prefix, *extra]
        common = _common_prefix(kv.tokens, full, kv.confirmed)
        common = min(common, len(prefix) - 1)  # we need the logits of the last prefix position
        kv.confirmed = common
        cached = len(kv.tokens)
        if cached > common:
            kv.cache.crop(common - cached)  # negative: remove that many positions (works on 4.x and 5.x)
        new = full[common:]
        out = self.model(
            input_ids=torch.tensor([new], dtype=torch.long, device=self.device),
            past_key_values=kv.cache,
            use_cache=True,
        )
        kv.tokens = full
        logits: torch.Tensor = out.logits[0, -(len(extra) + 1) :].float().cpu()
        return logits

    @torch.inference_mode()
    def prompt_logits(self, token_ids: Sequence[int]) -> torch.Tensor:
        """Logits (float32, CPU) at every position of ``token_ids``, without a cache."""
        out = self.model(input_ids=torch.tensor([list(token_ids)], dtype=torch.long, device=self.device))
        logits: torch.Tensor = out.logits[0].float().cpu()
        return logits

    @torch.inference_mode()
    def append(self, request_id: str, token: int) -> torch.Tensor:
        """Feed one more token after what the cache holds; logits (float32, CPU) of that position."""
        kv = self._kv[request_id]
        out = self.model(
            input_ids=torch.tensor([[token]], dtype=torch.long, device=self.device),
            past_key_values=kv.cache,
            use_cache=True,
        )
        kv.tokens.append(token)
        logits: torch.Tensor = out.logits[0, -1].float().cpu()
        return logits


def _common_prefix(a: Sequence[int], b: Sequence[int], start: int) -> int:
    n = min(len(a), len(b))
    i = min(start, n)
    while i < n and a[i] == b[i]:
        i += 1
    return i


def _pick(
    logits: torch.Tensor, params: SamplingParams, rng: np.random.Generator
) -> tuple[int, FloatArray | None]:
    if params.greedy:
        return int(torch.argmax(logits).item()), None
    probs = process_logits(logits.double().numpy(), params)
    return sample_from(probs, rng), probs


def run_each(
    executor: str,
    batch: Sequence[T],
    seq_of: Callable[[T], SequenceState],
    one: Callable[[T], Any],
    skip: Any,
) -> list[Any]:
    """``one(item)`` for each item of a batch (on the worker thread), each failure reported for its own
    sequence: the others' results are computed, then ``RequestErrors`` names the failed ones. A sequence
    aborted meanwhile (``seq.cancelled``) is not computed: ``skip`` stands for its result."""
    out: list[Any] = []
    errors: dict[str, ExecutorError] = {}
    for item in batch:
        seq = seq_of(item)
        if seq.cancelled:
            out.append(skip)
            continue
        try:
            out.append(one(item))
        except Exception as exc:
            log.debug("%s executor failed request %s", executor, seq.request_id, exc_info=True)
            errors[seq.request_id] = ExecutorError(executor, f"{type(exc).__name__}: {exc}")
            out.append(skip)
    if errors:
        raise RequestErrors(errors)
    return out


def release_on(worker: concurrent.futures.Executor, model: CachedModel, request_id: str) -> None:
    """Free a request's cache on the worker thread, behind any call already queued there."""
    try:
        worker.submit(model.release, request_id)
    except RuntimeError:  # the worker is shut down: nothing can use the cache any more
        model.release(request_id)


class ReferenceTargetExecutor:
    def __init__(
        self, model: CachedModel, worker: concurrent.futures.Executor, max_draft_len: int = 64
    ) -> None:
        self.model = model
        self._worker = worker
        self._max_draft_len = max_draft_len

    @property
    def max_draft_len(self) -> int:
        return self._max_draft_len

    async def verify(self, batch: Sequence[VerifyRequest]) -> list[list[int]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, self._verify_all, list(batch))

    def release(self, request_id: str) -> None:
        release_on(self._worker, self.model, request_id)

    async def prompt_logprobs(self, prompt_ids: Sequence[int], top: int) -> list[TokenLogprob]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, self.score_prompt, list(prompt_ids), top)

    def _verify_all(self, batch: list[VerifyRequest]) -> list[list[int]]:
        return run_each("reference target", batch, lambda r: r.seq, self._verify, [])

    def _verify(self, req: VerifyRequest) -> list[int]:
        seq, draft = req.seq, req.proposal.tokens
        raw = self.model.logits_for(seq.request_id, seq.token_ids, draft).double().numpy()
        params = seq.params
        logits = target_logits(seq, draft, raw) if params.changes_logits or seq.constraint else raw
        if params.greedy:
            out = accept_token_match(draft, [int(i) for i in logits.argmax(axis=-1)])
        else:
            probs = process_logits(logits, params)
            if req.acceptance == AcceptanceRule.LOGITS:
                proposal = req.proposal
                out = accept_rejection_sampling(draft, proposal.probs, probs, seq.rng, cut=proposal.cut > 0)
            else:
                out = accept_token_match(draft, [sample_from(row, seq.rng) for row in probs])
        if req.logprobs is not None:
            req.logprobs.extend(token_logprobs(raw, out, params.logprobs or 0))
        return out

    def score_prompt(self, prompt_ids: Sequence[int], top: int) -> list[TokenLogprob]:
        """The target's log-probability of every prompt token after the first (for ``echo`` with
        ``logprobs``): one forward pass over the prompt, on no request's cache."""
        logits = self.model.prompt_logits(prompt_ids).double().numpy()
        return token_logprobs(logits[:-1], list(prompt_ids[1:]), top)


class ReferenceDraftExecutor:
    """Generates draft tokens autoregressively: argmax for greedy requests and token-match acceptance, a
    sample
    from the processed draft distribution (returned with the tokens) when acceptance is by logits."""

    def __init__(self, model: CachedModel, worker: concurrent.futures.Executor) -> None:
        self.model = model
        self._worker = worker

    async def draft(self, batch: Sequence[DraftRequest]) -> list[Proposal]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, self._draft_all, list(batch))

    def release(self, request_id: str) -> None:
        release_on(self._worker, self.model, request_id)

    def _draft_all(self, batch: list[DraftRequest]) -> list[Proposal]:
        return run_each("reference draft", batch, lambda r: r.seq, self._draft, Proposal([]))

    def _draft(self, req: DraftRequest) -> Proposal:
        seq = req.seq
        sample = req.want_probs and not seq.params.greedy
        params = seq.params if sample else SamplingParams(temperature=0.0)
        logits = self.model.logits_for(seq.request_id, seq.token_ids, [])[-1]

        def pick() -> tuple[int, FloatArray | None]:
            return _pick(logits, params, seq.rng)

        def feed(tokens: Sequence[int]) -> None:
            nonlocal logits
            for token in tokens:
                logits = self.model.append(seq.request_id, token)

        return draft_with_forced(seq, req.num_tokens, pick, feed)
