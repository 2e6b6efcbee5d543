"""Logits processing: what turns the target's raw logits into the distribution plain decoding samples from.

Two stages, in this order (as vLLM does):

1. :func:`target_logits` changes the logits: repetition penalty, presence and frequency penalties,
   ``logit_bias``, the stop tokens while fewer than ``min_tokens`` are generated, then the grammar mask of
   a structured-output request (forbidden tokens get ``-inf``).
   Greedy decoding takes the argmax of these logits; token-match acceptance compares draft tokens with it.
2. :func:`process_logits` turns logits into probabilities: temperature, then top-k, top-p (nucleus) and
   min-p filtering. Rejection sampling uses these probabilities, so speculation samples exactly the
   distribution plain sampling with the same settings would.

Speculation verifies ``k`` draft tokens at once, so both stages work on ``k + 1`` rows: row ``i`` follows
the sequence plus the first ``i`` draft tokens, and every penalty and the grammar state are taken at that
point (as if the draft tokens before it had been emitted). The grammar itself is behind
:class:`~specdeploy_server.core.types.TokenConstraint`; the serving layer implements it with llguidance, the
core knows only this protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from specdeploy_server.core.types import (
    FloatArray,
    Proposal,
    SamplingParams,
    SequenceState,
    TokenLogprob,
)


def target_logits(seq: SequenceState, draft: Sequence[int], logits: FloatArray) -> FloatArray:
    """The target's raw logits at the ``len(draft) + 1`` positions of a verification -> the logits plain
    decoding would use there: penalties, ``logit_bias`` and the grammar mask applied (a new array)."""
    x: FloatArray = np.array(logits, dtype=np.float64)
    if x.ndim == 1:
        x = x[None, :]
    params = seq.params
    vocab = x.shape[-1]
    if params.penalises:
        _penalise(x, params, seq.prompt_ids, seq.generated_ids, draft)
    for i in range(min(x.shape[0], params.min_tokens - seq.num_generated)):
        x[i, [t for t in banned_stops(seq, i) if t < vocab]] = -np.inf
    if seq.constraint is not None:
        allowed = seq.constraint.masks(draft, vocab)
        x[~allowed[: x.shape[0]]] = -np.inf
    return x


def banned_stops(seq: SequenceState, position: int) -> list[int]:
    """The tokens forbidden at ``position`` tokens after the sequence's generated ones: its stop tokens while
    fewer than ``min_tokens`` tokens are generated there (vLLM's ``min_tokens``), else none. The target's
    verification and the draft model mask the same tokens, so drafts propose what the target can accept."""
    if seq.num_generated + position >= seq.params.min_tokens:
        return []
    return sorted(seq.stop_token_ids)


def _penalise(
    x: FloatArray,
    params: SamplingParams,
    prompt: Sequence[int],
    generated: Sequence[int],
    draft: Sequence[int],
) -> None:
    vocab = x.shape[-1]
    counts = np.bincount(np.asarray(generated, dtype=np.int64), minlength=vocab)[:vocab].astype(np.float64)
    in_prompt = np.zeros(vocab, dtype=bool)
    if params.repetition_penalty != 1.0:
        in_prompt[np.asarray(prompt, dtype=np.int64)] = True
    bias = np.zeros(vocab)
    for token, value in params.logit_bias.items():
        bias[token] += value
    for i in range(x.shape[0]):
        if i > 0:
            counts[draft[i - 1]] += 1.0
        row = x[i]
        if params.repetition_penalty != 1.0:
            seen = in_prompt | (counts > 0)
            rp = params.repetition_penalty
            with np.errstate(over="ignore"):  # +inf: process_logits ties it with the other largest
                row[seen] = np.where(row[seen] > 0, row[seen] / rp, row[seen] * rp)
        if params.frequency_penalty:
            row -= params.frequency_penalty * counts
        if params.presence_penalty:
            row -= params.presence_penalty * (counts > 0)
        row += bias


def process_logits(logits: FloatArray, params: SamplingParams) -> FloatArray:
    """Logits row(s) -> the distribution the target samples from: temperature, then top-k, nucleus (top-p)
    and min-p filtering. ``-inf`` logits (a grammar's forbidden tokens) get probability 0."""
    x: FloatArray = np.asarray(logits, dtype=np.float64)
    temperature = params.temperature if params.temperature > 0 else 1.0
    # An extreme penalty can overflow a logit to +inf (repetition_penalty 5e-324): it ties with the other
    # largest ones. Shifted before the division, the best logit stays 0 and the rest go to -inf for any
    # temperature, even one so small that the logits themselves would overflow (1e-310). Either used to make
    # every probability NaN.
    with np.errstate(over="ignore", invalid="ignore"):  # overflow -> -inf, probability 0: what is meant
        x = np.minimum(x, np.finfo(np.float64).max)
        x = (x - x.max(axis=-1, keepdims=True)) / temperature
    probs: FloatArray = np.exp(x)
    probs /= probs.sum(axis=-1, keepdims=True)
    if params.top_k > 0 and params.top_k < probs.shape[-1]:
        probs = _top_k(probs, params.top_k)
    if params.top_p < 1.0:
        probs = _top_p(probs, params.top_p)
    if params.min_p > 0.0:
        probs = _min_p(probs, params.min_p)
    return probs


def _top_k(probs: FloatArray, k: int) -> FloatArray:
    order = np.argsort(-probs, axis=-1, kind="stable")
    keep = np.zeros(probs.shape, dtype=bool)
    np.put_along_axis(keep, order[..., :k], True, axis=-1)
    out: FloatArray = np.where(keep, probs, 0.0)
    out /= out.sum(axis=-1, keepdims=True)
    return out


def _top_p(probs: FloatArray, top_p: float) -> FloatArray:
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_probs = np.take_along_axis(probs, order, axis=-1)
    cum = np.cumsum(sorted_probs, axis=-1)
    # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
    keep_sorted = (cum - sorted_probs) < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    out: FloatArray = np.where(keep, probs, 0.0)
    out /= out.sum(axis=-1, keepdims=True)
    return out


def _min_p(probs: FloatArray, min_p: float) -> FloatArray:
    out: FloatArray = np.where(probs >= min_p * probs.max(axis=-1, keepdims=True), probs, 0.0)
    out /= out.sum(axis=-1, keepdims=True)
    return out


def token_logprobs(logits: FloatArray, tokens: Sequence[int], top: int) -> list[TokenLogprob]:
    """The log-softmax of raw logits row ``j`` at ``tokens[j]``, with the ``top`` most likely tokens of that
    row (what plain decoding reports: the model's own log-probabilities, before penalties and filtering)."""
    x = np.asarray(logits, dtype=np.float64)[: len(tokens)]
    shifted = x - x.max(axis=-1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    out: list[TokenLogprob] = []
    for row, token in zip(logp, tokens, strict=True):
        alternatives: tuple[tuple[int, float], ...] = ()
        if top > 0:
            best = np.argsort(-row, kind="stable")[:top]
            alternatives = tuple((int(t), float(row[t])) for t in best)
        out.append(TokenLogprob(int(token), float(row[token]), alternatives))
    return out


def cut_proposal(seq: SequenceState, proposal: Proposal) -> Proposal:
    """The proposal without the draft tokens the sequence's grammar forbids (the first forbidden one and
    everything after it): verifying them cannot accept them. A sampled draft keeps the draft distribution
    of the first cut position, so rejection sampling draws that position from the residual as it would
    have."""
    constraint = seq.constraint
    if constraint is None or not proposal.tokens:
        return proposal
    allowed = constraint.allowed_prefix(proposal.tokens)
    if allowed >= len(proposal.tokens):
        return proposal
    probs = proposal.probs[: allowed + 1] if proposal.probs is not None else None
    forced = tuple(i for i in proposal.forced if i < allowed)
    return Proposal(
        list(proposal.tokens[:allowed]),
        probs,
        cut=len(proposal.tokens) - allowed,
        forced=forced,
        from_prediction=proposal.from_prediction,
    )


def draft_with_forced(
    seq: SequenceState,
    num_tokens: int,
    pick: Callable[[], tuple[int, FloatArray | None]],
    feed: Callable[[Sequence[int]], None],
) -> Proposal:
    """A drafter's loop for ``num_tokens`` tokens: ``pick()`` drafts one token from the draft model's latest
    logits, ``feed(tokens)`` extends the draft model's context. Under a grammar, the tokens it forces after a
    drafted token go into the proposal as they are (the draft model is not asked to obey the grammar; it
    would only waste draft steps on them), and drafting stops at a token the grammar forbids (it will be cut
    before verification, and everything after it with it)."""
    tokens: list[int] = []
    rows: list[FloatArray] = []
    forced_at: list[int] = []
    constraint = seq.constraint
    while len(tokens) < num_tokens:
        token, probs = pick()
        tokens.append(token)
        if probs is not None:
            rows.append(probs)
        fed = [token]
        if constraint is not None:
            forced = constraint.forced_after(tokens, num_tokens - len(tokens))
            if forced is None:
                break
            for t in forced:
                forced_at.append(len(tokens))
                tokens.append(t)
                if probs is not None:
                    one_hot = np.zeros_like(probs)
                    one_hot[t] = 1.0
                    rows.append(one_hot)
            fed += forced
        if len(tokens) < num_tokens:
            feed(fed)
    return Proposal(tokens, np.stack(rows) if rows else None, forced=tuple(forced_at))


def fast_forward(seq: SequenceState, room: int) -> list[int]:
    """Tokens the grammar forces next (the only one it allows at their position), up to ``room`` of them:
    plain decoding would emit them with certainty, so they are emitted without a model step. Not done when
    the request wants logprobs (those come from the target's forward pass)."""
    if seq.constraint is None or seq.params.logprobs is not None or room <= 0:
        return []
    return seq.constraint.take_forced(room)
