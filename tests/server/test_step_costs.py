"""The stand-ins' step-time model (memory-bound below a knee, compute-bound above) and acceptance models."""

from __future__ import annotations

import asyncio
import random
import statistics

import pytest
from specdeploy_server.backends.standin import StandInTarget
from specdeploy_server.backends.step_costs import (
    AcceptanceModel,
    StepTimeModel,
    alpha_for_tokens_per_step,
    expected_tokens_per_step,
)
from specdeploy_server.core.executors import VerifyRequest
from specdeploy_server.core.types import Proposal, SamplingParams, SequenceState


def test_a_pass_costs_the_memory_bound_time_below_the_knee_and_grows_with_tokens_above_it() -> None:
    model = StepTimeModel(memory_bound_seconds=0.02, knee_tokens=64)
    assert model.seconds(1) == model.seconds(64) == 0.02
    assert model.seconds(128) == pytest.approx(0.04)
    assert model.seconds(0) == 0.0
    assert StepTimeModel(0.02).seconds(10_000) == 0.02  # no knee: the old fixed-time stand-in


def test_a_draft_call_is_one_pass_per_depth_over_the_sequences_still_drafting() -> None:
    model = StepTimeModel(memory_bound_seconds=0.001, knee_tokens=2)
    # depths 1..3: 3 sequences (1.5x the knee), then 2, then 1
    assert model.draft_seconds([3, 2, 1]) == pytest.approx(0.0015 + 0.001 + 0.001)
    assert model.draft_seconds([0, 0]) == 0.0


def test_alpha_for_tokens_per_step_inverts_the_geometric_expectation() -> None:
    alpha = alpha_for_tokens_per_step(5.0, 10)
    assert expected_tokens_per_step(alpha, 10) == pytest.approx(5.0)
    with pytest.raises(ValueError, match="impossible"):
        alpha_for_tokens_per_step(12.0, 10)


def test_per_prompt_alphas_spread_around_the_mean() -> None:
    spread = AcceptanceModel(0.8, concentration=12.0)
    rng = random.Random(0)
    draws = [spread.draw(rng) for _ in range(4000)]
    assert statistics.fmean(draws) == pytest.approx(0.8, abs=0.01)
    assert statistics.pstdev(draws) == pytest.approx((0.8 * 0.2 / 13) ** 0.5, rel=0.1)
    assert AcceptanceModel(0.8).draw(rng) == 0.8


def _verify(target: StandInTarget, seqs: list[SequenceState], k: int) -> list[list[int]]:
    return asyncio.run(target.verify([VerifyRequest(seq, Proposal([97] * k), "tokenMatch") for seq in seqs]))


def test_a_prompt_has_the_same_alpha_in_every_request_and_run() -> None:
    acceptance = AcceptanceModel(0.5, concentration=2.0)

    def target() -> StandInTarget:
        return StandInTarget(0.0, 0.5, seed=3, time_model=StepTimeModel(0.0), acceptance=acceptance)

    first, second = target(), target()
    a, b, a_again = (
        SequenceState("r0", [97], 100, SamplingParams()),
        SequenceState("r1", [98], 100, SamplingParams()),
        SequenceState("r2", [97], 100, SamplingParams()),
    )
    _verify(first, [a, b], 4)
    assert first.alpha_of(a) != first.alpha_of(b)
    assert second.alpha_of(a_again) == first.alpha_of(a)
    first.release("r0")
    assert "r0" in first.released
    assert first.alpha_of(b) == second.alpha_of(b)


def test_acceptance_is_a_function_of_the_position_so_any_draft_length_meets_the_same_draws() -> None:
    # The accepted run of a k=8 proposal starts with the accepted run of a k=2 proposal at the same position.
    target = StandInTarget(0.0, 0.7, seed=5, time_model=StepTimeModel(0.0))
    runs = []
    for i in range(40):
        seq = SequenceState(
            f"r{i}", [97, 98 + i % 20], 100, SamplingParams(), token_ids=[97, 98 + i % 20, 99]
        )
        long, short = _verify(target, [seq], 8)[0], _verify(target, [seq], 2)[0]
        assert len(short) - 1 == min(len(long) - 1, 2)
        runs.append(len(long) - 1)
    assert len(set(runs)) > 2  # the positions differ in what they accept


def test_seeded_acceptance_accepts_each_draft_token_with_probability_alpha() -> None:
    target = StandInTarget(0.0, 0.7, seed=1, time_model=StepTimeModel(0.0))
    seqs = [SequenceState(f"r{i}", [97, i % 256, i // 256], 100, SamplingParams()) for i in range(4000)]
    accepted = sum(len(out) - 1 for out in _verify(target, seqs, 1))
    assert accepted / len(seqs) == pytest.approx(0.7, abs=0.03)
    assert sum(target.emitted_by_alpha.values()) == accepted + len(seqs)
