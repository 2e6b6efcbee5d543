"""Acceptance rules: pure functions from (draft tokens, distributions) to the tokens a step emits.

Both rules return the accepted prefix of the draft followed by exactly one token chosen by the target (the
correction at the first rejected position, or the bonus token after a fully accepted draft). Neither rule
changes
the distribution of the target's output; token match is exact for greedy decoding, rejection sampling
(Leviathan et al. 2023, Chen et al. 2023) for any temperature.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specdeploy_server.core.logits import process_logits
from specdeploy_server.core.types import FloatArray

__all__ = [
    "accept_rejection_sampling",
    "accept_token_match",
    "accepted_prefix",
    "process_logits",
    "sample_from",
]


def sample_from(probs: FloatArray, rng: np.random.Generator) -> int:
    """Draw one index from an (unnormalised, non-negative) probability row by inverse CDF."""
    cdf = np.cumsum(probs)
    total = float(cdf[-1])
    if not total > 0.0:
        raise ValueError("cannot sample from an all-zero distribution")
    idx = int(np.searchsorted(cdf, rng.random() * total, side="right"))
    return min(idx, len(probs) - 1)


def accept_token_match(draft_tokens: Sequence[int], target_tokens: Sequence[int]) -> list[int]:
    """Token-match acceptance (TensorRT-LLM ``use_logits=False``).

    ``target_tokens[i]`` is the token the target itself picks at draft position i given the prefix and the
    draft
    tokens before i (argmax for greedy, a sample from p_i otherwise); it has ``len(draft_tokens) + 1``
    entries.
    """
    if len(target_tokens) != len(draft_tokens) + 1:
        raise ValueError(f"need {len(draft_tokens) + 1} target tokens, got {len(target_tokens)}")
    out: list[int] = []
    for draft, own in zip(draft_tokens, target_tokens, strict=False):
        if draft != own:
            out.append(int(own))
            return out
        out.append(int(draft))
    out.append(int(target_tokens[-1]))
    return out


def accept_rejection_sampling(
    draft_tokens: Sequence[int],
    draft_probs: FloatArray | None,
    target_probs: FloatArray,
    rng: np.random.Generator,
    cut: bool = False,
) -> list[int]:
    """Speculative sampling (TensorRT-LLM ``use_logits=True``).

    Draft token i is accepted with probability ``min(1, p_i(x) / q_i(x))``; at the first rejection the step
    emits a
    sample from ``normalize(max(p_i - q_i, 0))``; when all k are accepted it emits a bonus sample from
    ``p_k``.
    ``draft_probs`` (k x V) is ``None`` for a deterministic proposal, which is the one-hot case q_i(x) = 1.
    ``target_probs`` is (k + 1) x V.

    ``cut``: the draft had a token at position k that the target gives probability 0 (a grammar forbids it)
    and it was cut before verification; it would certainly have been rejected, so the token at position k is
    drawn from the residual with that position's draft distribution (row k of ``draft_probs``), exactly what
    verifying it would have done. A deterministic (one-hot) draft's residual is ``p_k`` itself.
    """
    k = len(draft_tokens)
    if target_probs.shape[0] != k + 1:
        raise ValueError(f"need {k + 1} target distributions, got {target_probs.shape[0]}")
    if draft_probs is not None and draft_probs.shape[0] < k:
        raise ValueError(f"need {k} draft distributions, got {draft_probs.shape[0]}")
    out: list[int] = []
    for i, token in enumerate(draft_tokens):
        p = target_probs[i]
        p_x = float(p[token])
        q_x = float(draft_probs[i, token]) if draft_probs is not None else 1.0
        if rng.random() * q_x < p_x:
            out.append(int(token))
            continue
        if draft_probs is not None:
            residual = np.maximum(p - draft_probs[i], 0.0)
        else:
            residual = p.copy()
            residual[token] = 0.0
        if not residual.sum() > 0.0:  # p == q up to rounding: any sample from p is exact
            residual = p
        out.append(sample_from(residual, rng))
        return out
    last = target_probs[k]
    if cut and draft_probs is not None and draft_probs.shape[0] > k:
        residual = np.maximum(last - draft_probs[k], 0.0)
        if residual.sum() > 0.0:
            last = residual
    out.append(sample_from(last, rng))
    return out


def accepted_prefix(draft: Sequence[int], output: Sequence[int]) -> int:
    """How many draft tokens the target accepted: the length of the common prefix of the draft and the
    target's output, as TensorRT-LLM's own draft-target loop counts it (the target's first own token differs
    from the draft token at that position, whichever acceptance rule it used)."""
    accepted = 0
    for drafted, emitted in zip(draft, output, strict=False):
        if drafted != emitted:
            break
        accepted += 1
    return accepted
