"""Reference backend: Hugging Face transformers + PyTorch, CPU or CUDA.

Each model keeps one KV cache per request (backends/kvbatch.py). Every call of the scheduler covers all
running sequences, and runs as one padded batch on a single worker thread: the verification of every
sequence's proposal is one forward pass of the target; drafting is one forward pass of the draft model that
catches every sequence up, then one pass per draft token for all sequences together. Sequences under a
grammar draft one by one (the grammar may force several tokens after a drafted one). The event loop is never
blocked.

Lifecycle rules (core/executors.py): a failure of one sequence's forward is reported for that sequence
(``RequestErrors``): when a batched pass fails, its sequences are run again one by one, so the failure is
attributed to the sequence that causes it and the others are unaffected; the worker skips a sequence aborted
before the call reached it; ``release`` runs on the worker thread itself, after whatever call is queued
before it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from transformers import AutoConfig

from specdeploy_server.backends.kvbatch import CachedModel, PaddedBatch
from specdeploy_server.backends.runahead import RunAhead, eligible
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
    banned_stops,
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

__all__ = [
    "GREEDY",
    "CachedModel",
    "ReferenceDraftExecutor",
    "ReferenceTargetExecutor",
    "max_position_embeddings",
    "pick_draft_token",
    "resolve_device",
    "resolve_dtype",
    "run_each",
]

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")

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


#: the sampling of a greedy draft (argmax)
GREEDY = SamplingParams(temperature=0.0)


def pick_draft_token(
    logits: torch.Tensor, params: SamplingParams, rng: np.random.Generator, banned: Sequence[int] = ()
) -> tuple[int, FloatArray | None]:
    """A draft token from the draft model's logits (``banned`` tokens masked out first: the stop tokens the
    target masks before ``min_tokens``), with the distribution it was sampled from (None: greedy)."""
    if banned:
        logits = logits.clone()
        logits[[t for t in banned if t < logits.shape[-1]]] = float("-inf")
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


def run_batched(
    executor: str,
    batch: Sequence[T],
    seq_of: Callable[[T], SequenceState],
    *,
    together: Callable[[list[T]], list[R]],
    finish: Callable[[T, R], Any],
    one: Callable[[T], Any],
    skip: Any,
    joins: Callable[[T], bool] = lambda _: True,
) -> list[Any]:
    """``together(items)`` for the live items that ``joins`` admits, in one go (the batched forward
    passes), then ``finish(item, its share)`` for each of them and ``one(item)`` for the others, as
    ``run_each`` does. When ``together`` fails, ``one(item)`` for every item instead, which attributes the
    failure to the sequences that cause it."""
    live = [item for item in batch if not seq_of(item).cancelled and joins(item)]
    shares: dict[int, R] = {}
    if live:
        try:
            shares = dict(zip(map(id, live), together(live), strict=True))
        except Exception:
            log.debug(
                "%s executor: a batch of %d failed, retried one by one", executor, len(live), exc_info=True
            )

    def each(item: T) -> Any:
        key = id(item)
        return finish(item, shares[key]) if key in shares else one(item)

    return run_each(executor, batch, seq_of, each, skip)


def release_on(worker: concurrent.futures.Executor, model: CachedModel | RunAhead, request_id: str) -> None:
    """Free a request's cache (or run-ahead) on the worker thread, behind any call already queued there."""
    try:
        worker.submit(model.release, request_id)
    except RuntimeError:  # the worker is shut down: nothing can use the cache any more
        model.release(request_id)


class ReferenceTargetExecutor:
    """``run_ahead``: with one greedy request running, start its next forward pass as soon as a step's tokens
    are known (backends/runahead.py)."""

    def __init__(
        self,
        model: CachedModel,
        worker: concurrent.futures.Executor,
        max_draft_len: int = 64,
        *,
        run_ahead: bool = False,
    ) -> None:
        self.model = model
        self._worker = worker
        self._max_draft_len = max_draft_len
        self.run_ahead = RunAhead(model) if run_ahead else None

    @property
    def max_draft_len(self) -> int:
        return self._max_draft_len

    @property
    def pads_rows(self) -> bool:
        """A batched pass is as wide as its widest row, and so are the draft passes
        (:func:`specdeploy_server.core.executors.pads_rows`); a model whose cache cannot be batched runs its
        rows one after another, each as wide as its own."""
        return self.model.batches

    async def verify(self, batch: Sequence[VerifyRequest]) -> list[list[int]]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, self._verify_all, list(batch))

    def release(self, request_id: str) -> None:
        release_on(self._worker, self.model, request_id)
        if self.run_ahead is not None:
            release_on(self._worker, self.run_ahead, request_id)

    async def prompt_logprobs(self, prompt_ids: Sequence[int], top: int) -> list[TokenLogprob]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, self.score_prompt, list(prompt_ids), top)

    def _verify_all(self, batch: list[VerifyRequest]) -> list[list[int]]:
        if not self.model.batches:
            return run_each("reference target", batch, lambda r: r.seq, self._verify, [])
        out = run_batched(
            "reference target",
            batch,
            lambda r: r.seq,
            together=self._forward,
            finish=self._accept,
            one=self._verify,
            skip=[],
        )
        if len(batch) == 1 and batch[0].extra and out[0] and eligible(batch[0]):
            self._decode_more(batch[0], out[0])
        ahead = self.run_ahead
        if ahead is not None and len(batch) == 1 and eligible(batch[0]):
            tokens = ahead.plan(batch[0], out[0])
            if tokens is not None:
                with contextlib.suppress(RuntimeError):  # the worker is shutting down: no step will follow
                    self._worker.submit(ahead.run, batch[0].seq, tokens)  # runs once this call answered
        return out

    def _decode_more(self, req: VerifyRequest, tokens: list[int]) -> None:
        """Up to ``req.extra`` more greedy tokens after ``tokens`` (the call's own), each fed to the request's
        cache in place (core/multistep.py); stops after a stop token or an abort. A forward that fails
        leaves the tokens decoded so far and drops the cache (the next call rebuilds it)."""
        seq = req.seq
        stops = seq.stop_token_ids
        try:
            for _ in range(req.extra):
                if tokens[-1] in stops or seq.cancelled:
                    return
                logits = self.model.append(seq.request_id, tokens[-1])
                tokens.append(int(torch.argmax(logits).item()))
        except Exception:
            log.debug("multi-step decoding of %s stopped by a failed forward", seq.request_id, exc_info=True)
            self.model.release(seq.request_id)

    def _forward(self, batch: list[VerifyRequest]) -> list[torch.Tensor]:
        ahead = self.run_ahead
        if ahead is not None and len(batch) == 1 and eligible(batch[0]):
            rows = ahead.take(batch[0])
            if rows is not None:
                return [rows]
        return self.model.logits_rows([(r.seq.request_id, r.seq.token_ids, r.proposal.tokens) for r in batch])

    def _verify(self, req: VerifyRequest) -> list[int]:
        seq = req.seq
        return self._accept(req, self.model.logits_for(seq.request_id, seq.token_ids, req.proposal.tokens))

    def _accept(self, req: VerifyRequest, logits_rows: torch.Tensor) -> list[int]:
        seq, draft = req.seq, req.proposal.tokens
        params = seq.params
        if params.greedy and not (params.changes_logits or seq.constraint) and req.logprobs is None:
            return accept_token_match(draft, logits_rows.argmax(dim=-1).tolist())
        raw = logits_rows.double().numpy()
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
    sample from the processed draft distribution (returned with the tokens) when acceptance is by logits."""

    def __init__(self, model: CachedModel, worker: concurrent.futures.Executor) -> None:
        self.model = model
        self._worker = worker

    async def draft(self, batch: Sequence[DraftRequest]) -> list[Proposal]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, self._draft_all, list(batch))

    def release(self, request_id: str) -> None:
        release_on(self._worker, self.model, request_id)

    def _draft_all(self, batch: list[DraftRequest]) -> list[Proposal]:
        if not self.model.batches:
            return run_each("reference draft", batch, lambda r: r.seq, self._draft, Proposal([]))
        return run_batched(  # sequences under a grammar draft one by one, the others together
            "reference draft",
            batch,
            lambda r: r.seq,
            together=self._draft_together,
            finish=lambda _, proposal: proposal,
            one=self._draft,
            skip=Proposal([]),
            joins=lambda r: r.seq.constraint is None,
        )

    def _draft_together(self, batch: list[DraftRequest]) -> list[Proposal]:
        """Every request's draft, one forward pass per draft position for all of them (no grammar: one token
        fed per request and position)."""
        passes = PaddedBatch(self.model, [(r.seq.request_id, r.seq.token_ids, 1) for r in batch])
        logits = torch.stack([row[-1] for row in passes.run()])
        params = [r.seq.params if r.want_probs and not r.seq.params.greedy else GREEDY for r in batch]
        tokens: list[list[int]] = [[] for _ in batch]
        probs: list[list[FloatArray]] = [[] for _ in batch]
        while True:
            fed: list[int | None] = []
            for i, req in enumerate(batch):
                if len(tokens[i]) >= req.num_tokens:
                    fed.append(None)
                    continue
                banned = banned_stops(req.seq, len(tokens[i]))
                token, row = pick_draft_token(logits[i], params[i], req.seq.rng, banned)
                tokens[i].append(token)
                if row is not None:
                    probs[i].append(row)
                fed.append(token if len(tokens[i]) < req.num_tokens else None)
            if all(t is None for t in fed):
                break
            logits = passes.feed(fed)
        passes.commit()
        return [Proposal(t, np.stack(p) if p else None) for t, p in zip(tokens, probs, strict=True)]

    def _draft(self, req: DraftRequest) -> Proposal:
        seq = req.seq
        sample = req.want_probs and not seq.params.greedy
        params = seq.params if sample else GREEDY
        logits = self.model.logits_for(seq.request_id, seq.token_ids, [])[-1]

        drafted = 0

        def pick() -> tuple[int, FloatArray | None]:
            return pick_draft_token(logits, params, seq.rng, banned_stops(seq, drafted))

        def feed(tokens: Sequence[int]) -> None:
            nonlocal logits, drafted
            drafted += len(tokens)
            for token in tokens:
                logits = self.model.append(seq.request_id, token)

        return draft_with_forced(seq, req.num_tokens, pick, feed)
