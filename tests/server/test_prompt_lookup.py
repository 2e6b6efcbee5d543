"""Prompt lookup drafting: longest n-gram first, oldest occurrence, fallback to plain decoding."""

from __future__ import annotations

import asyncio

from specdeploy_server.core.drafters import NgramIndex, PromptLookupDrafter
from specdeploy_server.core.types import SequenceState


def _lookup(tokens: list[int], k: int, max_n: int = 2) -> list[int]:
    index = NgramIndex(max_n)
    index.update(tokens)
    return index.lookup(tokens, k)


def test_the_longest_matching_ngram_wins() -> None:
    # suffix (1, 2): the bigram occurs at position 4 (followed by 7); the unigram 2 occurs earlier
    # (followed by 9)
    tokens = [2, 9, 9, 5, 1, 2, 7, 7, 1, 2]
    assert _lookup(tokens, 3) == [7, 7, 1]


def test_the_oldest_occurrence_is_used() -> None:
    tokens = [4, 5, 10, 4, 5, 20, 4, 5]
    assert _lookup(tokens, 1) == [10]


def test_proposal_is_cut_at_k_and_at_the_end_of_the_sequence() -> None:
    tokens = [1, 2, 3, 4, 1, 2]
    assert _lookup(tokens, 2) == [3, 4]
    assert _lookup(tokens, 10) == [3, 4, 1, 2]


def test_no_match_means_no_draft() -> None:
    assert _lookup([1, 2, 3, 4], 4) == []


def test_incremental_indexing_equals_indexing_from_scratch() -> None:
    tokens = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4, 6, 2, 6, 4, 3, 3, 8, 3, 2, 7, 9, 5]
    grown = NgramIndex(3)
    for end in range(1, len(tokens) + 1):
        grown.update(tokens[:end])
        fresh = NgramIndex(3)
        fresh.update(tokens[:end])
        assert grown.lookup(tokens[:end], 4) == fresh.lookup(tokens[:end], 4)


def test_drafter_keeps_one_index_per_request_and_forgets_it_on_release() -> None:
    drafter = PromptLookupDrafter(max_matching_ngram_size=2)
    a = SequenceState("a", [7, 8, 9, 7, 8], max_tokens=4)
    b = SequenceState("b", [1, 2, 3], max_tokens=4)
    proposals = asyncio.run(drafter.propose([(a, 3), (b, 3), (a, 0)], want_probs=False))
    assert [p.tokens for p in proposals] == [[9, 7, 8], [], []]
    drafter.release("a")
    drafter.release("b")
    assert not drafter._indexes
