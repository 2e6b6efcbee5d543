"""The logits-processing interface of the speculative core: penalties along a draft, filters, cutting draft
tokens a grammar forbids, and rejection sampling that stays exact when a sampled draft token was cut."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from scipy import stats  # type: ignore[import-untyped]
from specdeploy_server.backends.standin import standin_engine
from specdeploy_server.core.acceptance import accept_rejection_sampling, sample_from
from specdeploy_server.core.logits import (
    cut_proposal,
    draft_with_forced,
    fast_forward,
    process_logits,
    target_logits,
    token_logprobs,
)
from specdeploy_server.core.scheduler import SchedulerSettings
from specdeploy_server.core.types import BoolArray, Proposal, SamplingParams, SequenceState

VOCAB = 8


class EvenTokensOnly:
    """A grammar allowing only even tokens, except that after token 2 only token 4 is allowed."""

    def __init__(self) -> None:
        self.history: list[int] = []

    def _row(self, last: int | None) -> BoolArray:
        row = np.zeros(VOCAB, dtype=bool)
        if last == 2:
            row[4] = True
        else:
            row[::2] = True
        return row

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        last = self.history[-1] if self.history else None
        for i, token in enumerate(tokens):
            if not self._row(last)[token]:
                return i
            last = token
        return len(tokens)

    def masks(self, draft: Sequence[int], vocab_size: int) -> BoolArray:
        lasts = [self.history[-1] if self.history else None, *draft]
        return np.stack([self._row(last) for last in lasts])

    def take_forced(self, limit: int) -> list[int]:
        forced: list[int] = []
        while len(forced) < limit and self.history and self.history[-1] == 2:
            self.history.append(4)
            forced.append(4)
        return forced

    def advance(self, tokens: Sequence[int]) -> None:
        self.history.extend(tokens)

    def forced_after(self, prefix: Sequence[int], limit: int) -> list[int] | None:
        if self.allowed_prefix(prefix) < len(prefix):
            return None
        return [4][:limit] if prefix and prefix[-1] == 2 else []


def _seq(
    params: SamplingParams, generated: Sequence[int] = (), constraint: EvenTokensOnly | None = None
) -> SequenceState:
    seq = SequenceState("r", [1, 3], 100, params, constraint=constraint)
    seq.token_ids.extend(generated)
    return seq


def test_penalties_at_each_draft_position_are_those_of_the_sequence_extended_by_the_draft_before_it() -> None:
    params = SamplingParams(
        presence_penalty=0.7, frequency_penalty=0.3, repetition_penalty=1.4, logit_bias={5: 1.0}
    )
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(4, VOCAB))
    draft = [2, 2, 6]
    along = target_logits(_seq(params, [6, 1]), draft, logits)
    for i in range(4):
        alone = target_logits(_seq(params, [6, 1, *draft[:i]]), [], logits[i])
        np.testing.assert_allclose(along[i], alone[0])
    # the draft token repeated twice is penalised twice by frequency, once by presence
    plain = target_logits(_seq(SamplingParams()), draft, logits)
    assert along[3][2] < along[1][2] < plain[1][2]


def test_top_k_and_min_p_keep_the_most_likely_tokens() -> None:
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1]))
    top2 = process_logits(logits, SamplingParams(top_k=2))
    np.testing.assert_allclose(top2, [0.4 / 0.7, 0.3 / 0.7, 0, 0])
    minp = process_logits(logits, SamplingParams(min_p=0.5))  # keeps p >= 0.2
    np.testing.assert_allclose(minp, [0.4 / 0.9, 0.3 / 0.9, 0.2 / 0.9, 0])


def test_the_grammar_masks_each_position_along_the_draft() -> None:
    seq = _seq(SamplingParams(temperature=0.0), constraint=EvenTokensOnly())
    masked = target_logits(seq, [2], np.zeros((2, VOCAB)))
    assert np.isneginf(masked[0][1::2]).all()
    assert np.isfinite(masked[0][::2]).all()
    assert np.flatnonzero(np.isfinite(masked[1])).tolist() == [4]


def test_draft_tokens_the_grammar_forbids_are_cut_keeping_the_draft_row_of_the_first() -> None:
    seq = _seq(SamplingParams(), constraint=EvenTokensOnly())
    probs = np.full((4, VOCAB), 1.0 / VOCAB)
    cut = cut_proposal(seq, Proposal([0, 2, 6, 4], probs))
    assert cut.tokens == [0, 2]
    assert cut.cut == 2
    assert cut.probs is not None
    assert cut.probs.shape[0] == 3
    assert cut_proposal(seq, Proposal([0, 4])).cut == 0


def test_forced_tokens_are_taken_only_without_logprobs() -> None:
    constraint = EvenTokensOnly()
    constraint.advance([2])
    assert fast_forward(_seq(SamplingParams(logprobs=0), constraint=constraint), 5) == []
    assert fast_forward(_seq(SamplingParams(), constraint=constraint), 5) == [4]


def test_token_logprobs_are_the_log_softmax_of_the_raw_logits() -> None:
    logits = np.log(np.array([[0.5, 0.25, 0.25], [0.1, 0.2, 0.7]]))
    items = token_logprobs(logits, [1, 2], top=2)
    assert items[0].logprob == pytest.approx(np.log(0.25))
    assert items[1].top[0][0] == 2
    assert items[1].top[0][1] == pytest.approx(np.log(0.7))


@pytest.mark.parametrize("residual", [True, False])
def test_rejection_sampling_stays_exact_when_a_forbidden_sampled_draft_token_is_cut(residual: bool) -> None:
    """One position: the draft samples x ~ q; when the grammar forbids x (p(x) = 0) it is cut and the
    position is drawn from max(p - q, 0) (as verifying x would have); drawing from p instead is biased."""
    p = np.array([0.5, 0.0, 0.3, 0.0, 0.2])
    q = np.array([0.1, 0.4, 0.1, 0.3, 0.1])
    rng = np.random.default_rng(1)
    counts = np.zeros(len(p))
    for _ in range(20000):
        x = sample_from(q, rng)
        if p[x] == 0.0:  # cut before verification
            out = accept_rejection_sampling([], q[None, :], p[None, :], rng, cut=residual)
        else:
            out = accept_rejection_sampling([x], q[None, :], np.stack([p, p]), rng)
        counts[out[0]] += 1
    keep = p > 0
    pvalue = stats.chisquare(counts[keep], p[keep] * counts.sum()).pvalue
    assert counts[~keep].sum() == 0
    if residual:
        assert pvalue > 1e-3
    else:
        assert pvalue < 1e-6


def test_the_draft_carries_forced_tokens_as_they_are_and_stops_at_a_forbidden_token() -> None:
    seq = _seq(SamplingParams(), constraint=EvenTokensOnly())
    drafted = iter([0, 2, 6, 3, 8])
    fed: list[int] = []

    def pick() -> tuple[int, np.ndarray | None]:
        return next(drafted), np.full(VOCAB, 1.0 / VOCAB)

    proposal = draft_with_forced(seq, 10, pick, fed.extend)
    # 2 forces 4 (no draft step spent on it); 3 is forbidden: drafting stops there (it will be cut)
    assert proposal.tokens == [0, 2, 4, 6, 3]
    assert proposal.forced == (2,)
    assert proposal.probs is not None
    np.testing.assert_array_equal(proposal.probs[2], np.eye(VOCAB)[4])
    assert fed == [0, 2, 4, 6]
    cut = cut_proposal(seq, proposal)
    assert cut.tokens == [0, 2, 4, 6]
    assert cut.forced == (2,)


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(presence_penalty=1.0),
        SamplingParams(logit_bias={3: 1.0}),
        SamplingParams(top_k=3),
        SamplingParams(logprobs=0),
    ],
)
def test_an_engine_refuses_settings_its_backend_would_ignore(params: SamplingParams) -> None:
    engine, _ = standin_engine(0.0, 0.0, alpha=0.5, settings=SchedulerSettings())
    with pytest.raises(ValueError, match="backend standin does not support"):
        engine.generate([1, 2], 4, params)
    with pytest.raises(ValueError, match="grammar"):
        engine.generate([1, 2], 4, SamplingParams(), EvenTokensOnly())


@pytest.mark.parametrize("temperature", [5e-324, 1e-310, 1e-300, 1e-5])
def test_a_vanishing_temperature_samples_the_most_likely_token_instead_of_failing(temperature: float) -> None:
    """Found by the fuzzer: a subnormal temperature overflowed the logits and every probability was NaN."""
    probs = process_logits(np.array([[1.0, 2.0, -3.0, 1.999]]), SamplingParams(temperature=temperature))
    assert np.isfinite(probs).all()
    assert probs[0].argmax() == 1
    assert sample_from(probs[0], np.random.default_rng(0)) == 1


def test_a_penalty_that_overflows_logits_ties_them_instead_of_failing() -> None:
    """Found by the fuzzer: repetition_penalty 5e-324 divided the prompt's positive logits to +inf, and every
    probability was NaN (a 500 on the reference backend)."""
    seq = _seq(SamplingParams(temperature=1.0, repetition_penalty=5e-324))
    logits = np.array([0.5, 2.0, 3.0, 1.0, -1.0])  # prompt tokens 1 and 3 overflow to +inf
    probs = process_logits(target_logits(seq, [], logits), seq.params)
    assert np.allclose(probs[0], [0.0, 0.5, 0.0, 0.5, 0.0])
    assert sample_from(probs[0], np.random.default_rng(0)) in {1, 3}
