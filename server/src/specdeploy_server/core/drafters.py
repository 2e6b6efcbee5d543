"""Drafters: strategies that propose draft tokens for a sequence (cf. transformers' candidate generators)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from specdeploy_server.core.executors import CancelsInFlight, DraftExecutor, DraftRequest
from specdeploy_server.core.types import EMPTY_PROPOSAL, Proposal, SequenceState


class Drafter(Protocol):
    """Proposes up to k tokens per sequence and learns how many were accepted."""

    name: str
    #: seconds per proposed token are worth measuring (a model); prompt lookup is effectively free
    has_cost: bool

    async def propose(
        self, batch: Sequence[tuple[SequenceState, int]], want_probs: bool
    ) -> list[Proposal]: ...

    def observe(self, seq: SequenceState, proposal: Proposal, num_accepted: int) -> None: ...

    def release(self, request_id: str) -> None: ...


class NoDrafter:
    """``method: none`` — plain decoding through the same verify path (one token per step)."""

    name = "none"
    has_cost = False

    async def propose(self, batch: Sequence[tuple[SequenceState, int]], want_probs: bool) -> list[Proposal]:
        return [EMPTY_PROPOSAL for _ in batch]

    def observe(self, seq: SequenceState, proposal: Proposal, num_accepted: int) -> None:
        return None

    def release(self, request_id: str) -> None:
        return None


class DraftModelDrafter:
    """A draft model run by a draft executor: a separate, smaller model that shares the target's vocabulary
    (``draftTarget``), or a draft head on the target's hidden states (``eagle3``)."""

    has_cost = True

    def __init__(self, executor: DraftExecutor, name: str = "draftTarget") -> None:
        self.executor = executor
        self.name = name

    async def propose(self, batch: Sequence[tuple[SequenceState, int]], want_probs: bool) -> list[Proposal]:
        requests = [DraftRequest(seq, k, want_probs) for seq, k in batch if k > 0]
        drafted = iter(await self.executor.draft(requests) if requests else [])
        return [next(drafted) if k > 0 else EMPTY_PROPOSAL for _, k in batch]

    def observe(self, seq: SequenceState, proposal: Proposal, num_accepted: int) -> None:
        return None

    def cancel(self, request_id: str) -> None:
        if isinstance(self.executor, CancelsInFlight):
            self.executor.cancel(request_id)

    def release(self, request_id: str) -> None:
        self.executor.release(request_id)


class NgramIndex:
    """Every n-gram (n = 1..max_n) of a growing token list -> the position right after its oldest occurrence.

    Only occurrences followed by at least one token are indexed, so a match always has a continuation.
    Updating
    is incremental: each call indexes only the tokens appended since the last one.
    """

    def __init__(self, max_n: int) -> None:
        self.max_n = max_n
        self._first: dict[tuple[int, ...], int] = {}
        self._indexed_upto = 0  # continuation positions < this are indexed

    def update(self, tokens: Sequence[int]) -> None:
        for cont in range(max(self._indexed_upto, 1), len(tokens)):
            for n in range(1, min(self.max_n, cont) + 1):
                self._first.setdefault(tuple(tokens[cont - n : cont]), cont)
        self._indexed_upto = max(self._indexed_upto, len(tokens))

    def lookup(self, tokens: Sequence[int], num_tokens: int) -> list[int]:
        """Longest suffix n-gram first; the oldest earlier occurrence wins; [] when nothing matches."""
        length = len(tokens)
        for n in range(min(self.max_n, length), 0, -1):
            cont = self._first.get(tuple(tokens[length - n :]))
            if cont is not None:
                return list(tokens[cont : min(cont + num_tokens, length)])
        return []


class PromptLookupDrafter:
    """Prompt lookup decoding: copy the continuation of an earlier occurrence of the sequence's last n-gram.

    As TensorRT-LLM's NGram drafter and transformers' ``prompt_lookup_num_tokens``: match the last
    ``max_matching_ngram_size`` tokens down to 1 against prompt + generated text, take the oldest match,
    propose up
    to k tokens after it, and fall back to normal decoding (an empty proposal) when nothing matches.
    """

    name = "promptLookup"
    has_cost = False

    def __init__(self, max_matching_ngram_size: int = 2) -> None:
        if max_matching_ngram_size < 1:
            raise ValueError("max_matching_ngram_size must be >= 1")
        self.max_n = max_matching_ngram_size
        self._indexes: dict[str, NgramIndex] = {}

    async def propose(self, batch: Sequence[tuple[SequenceState, int]], want_probs: bool) -> list[Proposal]:
        return [self.propose_one(seq, k) for seq, k in batch]

    def propose_one(self, seq: SequenceState, k: int) -> Proposal:
        if k <= 0:
            return EMPTY_PROPOSAL
        index = self._indexes.get(seq.request_id)
        if index is None:
            index = self._indexes[seq.request_id] = NgramIndex(self.max_n)
        index.update(seq.token_ids)
        tokens = index.lookup(seq.token_ids, k)
        return Proposal(tokens) if tokens else EMPTY_PROPOSAL

    def observe(self, seq: SequenceState, proposal: Proposal, num_accepted: int) -> None:
        return None

    def release(self, request_id: str) -> None:
        self._indexes.pop(request_id, None)
