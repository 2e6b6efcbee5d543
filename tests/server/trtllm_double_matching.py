"""How the double's LLM drafts from the request's own tokens: TensorRT-LLM's n-gram drafter (oldest match of
the longest n-gram up to its size) and the suffix automaton (the latest occurrence of the longest earlier
suffix). Differences from the real drafters: trtllm_double.py, item 7."""

from __future__ import annotations


def longest_match_draft(ids: list[int], k: int, shortest: int) -> list[int]:
    """What follows the longest earlier occurrence of a suffix of `ids` (at least `shortest` tokens), its
    latest occurrence: a suffix automaton's draft."""
    for n in range(len(ids) - 1, shortest - 1, -1):
        tail = ids[-n:]
        for start in range(len(ids) - n - 1, -1, -1):
            if ids[start : start + n] == tail:
                return ids[start + n : start + n + k]
    return []


def ngram_draft(ids: list[int], k: int, max_n: int) -> list[int]:
    """What follows the oldest earlier occurrence of the longest suffix n-gram of at most `max_n` tokens."""
    for n in range(min(max_n, len(ids) - 1), 0, -1):
        tail = ids[-n:]
        for start in range(len(ids) - n):  # the oldest match
            if ids[start : start + n] == tail:
                return ids[start + n : start + n + k]
    return []
