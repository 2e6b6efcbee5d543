"""The acceptance rules as pure functions: exact cases and distributional (chi-square) checks."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats  # type: ignore[import-untyped]
from specdeploy_server.core.acceptance import (
    accept_rejection_sampling,
    accept_token_match,
    process_logits,
    sample_from,
)
from specdeploy_server.core.types import FloatArray, SamplingParams


def test_token_match_accepts_the_matching_prefix_then_takes_the_targets_token() -> None:
    assert accept_token_match([5, 6, 7], [5, 6, 9, 1]) == [5, 6, 9]
    assert accept_token_match([5, 6, 7], [4, 6, 7, 1]) == [4]


def test_token_match_adds_the_bonus_token_when_every_draft_token_matches() -> None:
    assert accept_token_match([5, 6], [5, 6, 8]) == [5, 6, 8]
    assert accept_token_match([], [3]) == [3]


def test_token_match_rejects_a_wrong_number_of_target_tokens() -> None:
    with pytest.raises(ValueError, match="need 3 target tokens"):
        accept_token_match([1, 2], [1, 2])


def _dist(values: list[float]) -> FloatArray:
    a: FloatArray = np.array(values, dtype=np.float64)
    out: FloatArray = a / a.sum()
    return out


# Context-free target/draft distributions over 6 tokens, 3 draft positions (+1 bonus row).
P = np.stack(
    [_dist([5, 1, 1, 1, 1, 1]), _dist([1, 2, 3, 4, 5, 6]), _dist([3, 3, 1, 1, 1, 1]), _dist([1] * 6)]
)
Q = np.stack([_dist([1, 1, 1, 1, 1, 5]), _dist([6, 5, 4, 3, 2, 1]), _dist([1, 1, 1, 1, 1, 1])])


def _chi_square_p(counts: np.ndarray, expected_probs: np.ndarray) -> float:
    expected = expected_probs * counts.sum()
    return float(stats.chisquare(counts, expected).pvalue)


@pytest.mark.parametrize("seed", [0, 1])
def test_rejection_sampling_outputs_follow_the_target_distribution_at_every_position(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = 20000
    counts = np.zeros((4, 6))
    for _ in range(n):
        draft = [sample_from(Q[i], rng) for i in range(3)]
        out = accept_rejection_sampling(draft, Q, P, rng)
        for position, token in enumerate(out):
            counts[position, token] += 1
    # position i is reached only when the draft tokens before it were accepted; given that, it is ~ P[i]
    for position in range(4):
        assert counts[position].sum() > 500
        assert _chi_square_p(counts[position], P[position]) > 1e-3, position


def test_rejection_sampling_with_a_deterministic_proposal_is_exact() -> None:
    # prompt lookup: q is one-hot on the proposed token, so acceptance probability is p(token)
    rng = np.random.default_rng(3)
    counts = np.zeros(6)
    accepted = 0
    n = 20000
    for _ in range(n):
        out = accept_rejection_sampling([0], None, P[:2], rng)
        counts[out[0]] += 1
        accepted += len(out) == 2
    assert _chi_square_p(counts, P[0]) > 1e-3
    assert abs(accepted / n - P[0, 0]) < 0.02


def test_a_draft_equal_to_the_target_is_always_accepted() -> None:
    rng = np.random.default_rng(4)
    for _ in range(500):
        draft = [sample_from(P[i], rng) for i in range(3)]
        assert len(accept_rejection_sampling(draft, P[:3], P, rng)) == 4


def test_a_token_the_target_cannot_produce_is_always_rejected() -> None:
    p = np.stack([_dist([0, 1, 1]), _dist([1, 1, 1])])
    q = np.stack([_dist([1, 0, 0])])
    rng = np.random.default_rng(5)
    for _ in range(200):
        out = accept_rejection_sampling([0], q, p, rng)
        assert len(out) == 1
        assert out[0] != 0


def test_process_logits_applies_temperature_and_top_p() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    full = process_logits(logits, SamplingParams(temperature=1.0))
    assert np.allclose(full, [0.5, 0.3, 0.15, 0.05])
    nucleus = process_logits(logits, SamplingParams(temperature=1.0, top_p=0.75))
    assert np.allclose(nucleus, [0.5 / 0.8, 0.3 / 0.8, 0, 0])
    sharp = process_logits(logits, SamplingParams(temperature=0.5))
    assert sharp[0] > 0.5
    assert np.isclose(sharp.sum(), 1.0)
