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


def test_each_request_keeps_its_own_alpha_until_released() -> None:
    target = StandInTarget(
        0.0, 0.5, time_model=StepTimeModel(0.0), acceptance=AcceptanceModel(0.5, concentration=2.0)
    )
    seqs = [SequenceState(f"r{i}", [97], 100, SamplingParams()) for i in range(2)]
    requests = [VerifyRequest(seq, Proposal([97] * 4), "tokenMatch") for seq in seqs]
    asyncio.run(target.verify(requests))
    first = dict(target._alphas)
    asyncio.run(target.verify(requests))
    assert target._alphas == first
    assert first["r0"] != first["r1"]
    target.release("r0")
    assert "r0" not in target._alphas
