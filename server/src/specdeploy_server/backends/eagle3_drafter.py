"""EAGLE-3 on the reference backend: a draft head that drafts from the target's own hidden states.

The target model keeps the outputs of the head's layers for every position its cache holds
(:meth:`CachedModel.tap`); the verification pass computes them as a side effect, so drafting costs the head's
one layer per token and nothing of the target. For a sequence of ``T`` tokens the head needs the target's
rows of positions ``0 .. T - 2`` (the last token, emitted by the previous step, has not been through the
target yet): the first step of a request, before the target has seen its prompt, proposes nothing.

Each request keeps the head's own KV cache. Positions computed from the target's rows stay valid for as long
as their tokens stay in the sequence; positions computed while drafting (whose hidden state is the head's own
output) are dropped before the next step, which recomputes them from the target's rows if they were accepted.
Sequences are drafted one after another (the head is one layer: its passes are small next to the target's).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache

from specdeploy_server.backends.eagle3_head import Eagle3Head, load_eagle3_head
from specdeploy_server.backends.kvbatch import CachedModel
from specdeploy_server.backends.reference import GREEDY, pick_draft_token, run_each
from specdeploy_server.core.executors import DraftRequest
from specdeploy_server.core.logits import banned_stops, draft_with_forced
from specdeploy_server.core.types import EMPTY_PROPOSAL, FloatArray, Proposal

__all__ = ["Eagle3DraftExecutor", "load_head_for"]


def load_head_for(path: Path, target: CachedModel) -> Eagle3Head:
    """The head at ``path``, checked against ``target`` and placed on its device and dtype; the target then
    keeps the outputs of the layers the head names."""
    model: Any = target.model
    config = model.config
    head = load_eagle3_head(
        path,
        target_layers=int(config.num_hidden_layers),
        target_hidden=int(config.hidden_size),
        target_vocab=target.vocab_size,
        target_lm_head=model.get_output_embeddings(),
    )
    dtype = next(model.parameters()).dtype
    head = head.to(device=target.device, dtype=dtype)  # d2t stays integral: a dtype cast skips it
    target.tap(head.checkpoint.aux_layer_ids)
    return head


@dataclass
class _HeadCache:
    cache: Any  # DynamicCache of the head's one layer
    #: the token embedded at each position the cache holds (position t: token t + 1 of the sequence)
    tokens: list[int] = field(default_factory=list)
    #: positions computed from the target's rows (the rest were drafted and are dropped before the next step)
    confirmed: int = 0


class Eagle3DraftExecutor:
    def __init__(self, head: Eagle3Head, target: CachedModel, worker: concurrent.futures.Executor) -> None:
        self.head = head
        self.target = target
        self._worker = worker
        self._embed: Any = target.model.get_input_embeddings()
        self._caches: dict[str, _HeadCache] = {}
        self.vocab_size = target.vocab_size
        #: the target id of each draft-vocabulary id (None: the head drafts over the target's vocabulary)
        d2t = head.d2t_map
        self._target_ids = (
            None if d2t is None else head.target_ids(torch.arange(len(d2t), device=d2t.device)).cpu()
        )

    async def draft(self, batch: Sequence[DraftRequest]) -> list[Proposal]:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, self._draft_all, list(batch))

    def release(self, request_id: str) -> None:
        try:
            self._worker.submit(self._caches.pop, request_id, None)
        except RuntimeError:  # the worker is shut down
            self._caches.pop(request_id, None)

    def _draft_all(self, batch: list[DraftRequest]) -> list[Proposal]:
        return run_each("eagle3 draft", batch, lambda r: r.seq, self._draft, EMPTY_PROPOSAL)

    @torch.inference_mode()
    def _draft(self, req: DraftRequest) -> Proposal:
        seq = req.seq
        tokens = seq.token_ids
        known = len(tokens) - 1  # head positions the target's rows cover: 0 .. T - 2
        state = self._caches.get(seq.request_id)
        if state is None:
            fresh = _HeadCache(DynamicCache(config=self.head.checkpoint.config))
            state = self._caches[seq.request_id] = fresh
        # at least the last known position is computed again: its output starts the draft
        keep = _common(state.tokens, tokens[1:], min(state.confirmed, known - 1))
        rows = self.target.features(seq.request_id, tokens, keep, known)
        if rows is None or req.num_tokens <= 0:
            return EMPTY_PROPOSAL
        self._cut(state, keep)
        logits, prenorm = self._run(state, self.head.fuse(rows.unsqueeze(0)), tokens[keep + 1 :])
        state.confirmed = known

        sample = req.want_probs and not seq.params.greedy
        params = seq.params if sample else GREEDY
        drafted = 0

        def pick() -> tuple[int, FloatArray | None]:
            return pick_draft_token(self._full_vocab(logits), params, seq.rng, banned_stops(seq, drafted))

        def feed(fed: Sequence[int]) -> None:
            nonlocal logits, prenorm, drafted
            drafted += len(fed)
            for token in fed:
                logits, prenorm = self._run(state, prenorm, [token])

        return draft_with_forced(seq, req.num_tokens, pick, feed)

    def _cut(self, state: _HeadCache, keep: int) -> None:
        cached = int(state.cache.get_seq_length())
        if cached > keep:
            state.cache.crop(keep - cached)
        del state.tokens[keep:]
        state.confirmed = min(state.confirmed, keep)

    def _run(
        self, state: _HeadCache, hidden: torch.Tensor, tokens: Sequence[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed ``tokens`` with ``hidden`` (``[1, len(tokens), hidden]``, or the previous pre-norm output
        whose last row stands for one token) at the head's next positions: the last position's logits over
        the draft vocabulary, and its pre-norm output ``[1, 1, hidden]``."""
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.target.device)
        hidden = hidden[:, -len(tokens) :]
        logits, prenorm = self.head(hidden, self._embed(ids), len(state.tokens), state.cache)
        state.tokens.extend(tokens)
        return logits[0, -1], prenorm[:, -1:]

    def _full_vocab(self, draft_logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits placed at their target ids (-inf elsewhere), as float32 on the CPU."""
        logits = draft_logits.float().cpu()
        if self._target_ids is None:
            return logits
        full = torch.full((self.vocab_size,), float("-inf"))
        full[self._target_ids] = logits
        return full


def _common(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    i, n = 0, min(len(a), len(b), limit)
    while i < n and a[i] == b[i]:
        i += 1
    return i
