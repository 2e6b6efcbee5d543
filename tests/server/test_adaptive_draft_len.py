"""draftLen: auto chooses per-sequence draft lengths for the whole batch from measured costs and acceptance.

Synthetic inputs only: costs come from a roofline step-time model (memory-bound below a knee, compute-bound
above), acceptance from seeded random draws; nothing here is timed.
"""

from __future__ import annotations

import itertools
import random

import pytest
from specdeploy_server.backends.step_costs import PRESETS, StepTimeModel
from specdeploy_server.core.adaptive import (
    NO_DRAFT,
    DraftLenController,
    expected_tokens_per_step,
    group_alphas,
)

TARGET = StepTimeModel(memory_bound_seconds=0.02, knee_tokens=64)
DRAFT = StepTimeModel(memory_bound_seconds=0.0015, knee_tokens=256)


def _measured(ctl: DraftLenController, target: StepTimeModel = TARGET, draft: StepTimeModel = DRAFT) -> None:
    """Feed the controller the model's costs at every size a step can have (as if measured, three times)."""
    for _ in range(3):
        for tokens in [1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128, 181, 256, 362, 512, 724, 1024,
                       1448, 2048, 2896]:  # fmt: skip
            ctl.verify_curve.observe(tokens, target.seconds(tokens))
        for passes in range(1, ctl.max_k + 1):
            for sequences in [1, 2, 4, 8, 16, 32, 64, 128, 256]:
                ctl.draft_cost.observe(passes, sequences, draft.draft_seconds([passes] * sequences))


def _best_uniform_k(alpha: float, batch: int, max_k: int) -> int:
    def rate(k: int) -> float:
        seconds = DRAFT.draft_seconds([k] * batch) + TARGET.seconds(batch * (k + 1))
        return batch * expected_tokens_per_step(alpha, k) / seconds

    return max(range(max_k + 1), key=rate)


def _simulate(
    ctl: DraftLenController, batch: int, alphas: list[float], steps: int, rng: random.Random
) -> list[list[int]]:
    """Run ``steps`` steps of a batch against the roofline model; return each step's plan."""
    ids = [f"r{i}" for i in range(batch)]
    plans = []
    for _ in range(steps):
        ks = ctl.plan(ids)
        plans.append(ks)
        tokens = sum(k + 1 for k in ks)
        ctl.observe_costs(ks, DRAFT.draft_seconds(ks), tokens, TARGET.seconds(tokens))
        for rid, k, alpha in zip(ids, ks, alphas, strict=True):
            accepted = 0
            while accepted < k and rng.random() < alpha:
                accepted += 1
            ctl.observe_acceptance(rid, k, accepted)
    return plans


def test_expected_tokens_per_step_matches_the_geometric_formula() -> None:
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(1.0, 5) == 6.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)


@pytest.mark.parametrize(("alpha", "batch"), [(0.8, 1), (0.8, 8), (0.8, 16), (0.8, 32), (0.6, 4), (0.9, 24)])
def test_one_acceptance_for_the_batch_gives_the_best_uniform_draft_length(alpha: float, batch: int) -> None:
    ctl = DraftLenController(max_k=10)
    _measured(ctl)
    plan = ctl.choose_plan({alpha: batch}, None)
    assert ctl.draft_len_at(alpha, plan) == _best_uniform_k(alpha, batch, 10)


def test_a_memory_bound_batch_drafts_long_and_a_compute_bound_batch_not_at_all() -> None:
    ctl = DraftLenController(max_k=10)
    _measured(ctl)
    ctl.accepted, ctl.rejections = 8.0, 2.0  # alpha 0.8 for every sequence
    assert ctl.plan(["a"]) == [_best_uniform_k(0.8, 1, 10)] == [7]
    ctl.current = None
    assert ctl.plan([f"r{i}" for i in range(256)]) == [0] * 256


def test_sequences_that_accept_more_draft_more_and_poor_ones_not_at_all() -> None:
    ctl = DraftLenController(max_k=10)
    _measured(ctl)
    ctl.accepted, ctl.rejections = 1.0, 1.0
    ids = [f"r{i}" for i in range(16)]
    for _ in range(20):
        for rid in ids[:8]:
            ctl.observe_acceptance(rid, 4, 4)  # every draft token accepted
        for rid in ids[8:]:
            ctl.observe_acceptance(rid, 4, 0)  # none
    ks = ctl.plan(ids)
    assert min(ks[:8]) >= 4
    assert ks[8:] == [0] * 8


def test_the_plan_beats_every_uniform_draft_length_under_a_mixed_batch() -> None:
    ctl = DraftLenController(max_k=10, hysteresis=0.0)
    _measured(ctl)
    groups = {0.95: 10, 0.7: 10, 0.3: 12}
    best = ctl.predicted_rate(groups, ctl.choose_plan(groups, None))
    for k in range(11):
        draft_lens = [k] * 32
        uniform = sum(n * expected_tokens_per_step(a, k) for a, n in groups.items()) / (
            DRAFT.draft_seconds(draft_lens) + TARGET.seconds(32 * (k + 1))
        )
        assert best >= uniform * 0.99


def test_a_new_sequence_starts_from_the_batch_acceptance_and_learns_its_own() -> None:
    ctl = DraftLenController(max_k=8)
    ctl.accepted, ctl.rejections = 9.0, 1.0
    assert ctl.alpha_of("new") == pytest.approx(0.9)
    for _ in range(50):
        ctl.observe_acceptance("poor", 4, 0)
    assert ctl.alpha_of("poor") < 0.1
    ctl.forget("poor")
    assert ctl.alpha_of("poor") == pytest.approx(ctl.alpha)


def test_unmeasured_costs_are_explored_and_the_load_change_converges_within_a_few_steps() -> None:
    ctl = DraftLenController(max_k=10)
    rng = random.Random(1)
    light = _simulate(ctl, 1, [0.8], 60, rng)
    assert 6 <= light[-1][0] <= 9  # 7 at the true alpha; the estimate after 60 steps is close
    heavy = _simulate(ctl, 128, [0.8] * 128, 40, rng)
    # settled: nobody drafts (the measured costs rule drafting out at batch 128: not even exploration)
    first_settled = next(i for i, ks in enumerate(heavy) if all(sum(plan) <= 1 for plan in heavy[i:]))
    assert first_settled <= 8
    assert sum(sum(plan) for plan in heavy[first_settled:]) <= 1
    back = _simulate(ctl, 1, [0.8], 10, rng)
    assert back[0][0] >= 6  # costs at batch 1 are known: no re-learning


def test_the_plan_does_not_oscillate_at_a_load_where_two_plans_are_close() -> None:
    # Batch 12 at alpha 0.8: draft lengths around 5-8 predict rates within a few per cent of each other.
    ctl = DraftLenController(max_k=10)
    _simulate(ctl, 12, [0.8] * 12, 100, random.Random(2))
    plans: list[tuple[float, int] | None] = []
    for _ in range(300):
        _simulate(ctl, 12, [0.8] * 12, 1, random.Random(len(plans)))
        plans.append(ctl.current)
    changes = sum(1 for a, b in itertools.pairwise(plans) if a != b)
    assert changes <= 3


def test_hysteresis_keeps_the_current_plan_unless_the_best_is_clearly_better() -> None:
    ctl = DraftLenController(max_k=10, hysteresis=0.03)
    _measured(ctl)
    groups = {0.8: 12}
    best = ctl.choose_plan(groups, None)
    neighbour = (best[0], ctl.draft_len_at(0.8, best) - 1)  # one draft token fewer
    close = ctl.predicted_rate(groups, neighbour) >= ctl.predicted_rate(groups, best) / 1.03
    assert ctl.choose_plan(groups, neighbour) == (neighbour if close else best)
    assert ctl.choose_plan(groups, NO_DRAFT) == best  # "no draft" is far worse at batch 12


def test_disable_above_concurrency_turns_drafting_off_for_larger_batches() -> None:
    ctl = DraftLenController(max_k=8, fixed=4, disable_above=8)
    assert ctl.plan(["a"] * 8) == [4] * 8
    assert ctl.plan(["a"] * 9) == [0] * 9


def test_exploration_drafts_one_token_for_one_sequence_while_the_plan_drafts_nothing() -> None:
    ctl = DraftLenController(max_k=8, explore_every=3)
    _measured(ctl)
    ctl.accepted, ctl.rejections = 0.0, 50.0
    plans = [ctl.plan(["a", "b"]) for _ in range(9)]
    assert [sum(ks) for ks in plans] == [0, 0, 1, 0, 0, 0, 0, 0, 1]  # then after 6 steps: the back-off


def _explorations(ctl: DraftLenController, ids: list[str], steps: int) -> list[int]:
    """The steps (from 1) at which somebody drafted."""
    return [step for step in range(1, steps + 1) if sum(ctl.plan(ids))]


def test_exploration_backs_off_while_it_keeps_confirming_no_draft_and_resumes_when_drafting_pays() -> None:
    ctl = DraftLenController(max_k=8, explore_every=32, explore_max=256)
    _measured(ctl)
    ctl.accepted, ctl.rejections = 0.0, 50.0  # alpha ~0: drafting does not pay
    at = _explorations(ctl, ["a", "b"], 1300)
    gaps = [b - a for a, b in itertools.pairwise([0, *at])]
    assert gaps == [32, 64, 128, 256, 256, 256, 256]
    ctl.accepted, ctl.rejections = 50.0, 1.0  # the acceptance came back: the plan drafts again
    ctl.current = None
    assert min(ctl.plan(["a", "b"])) > 0
    ctl.accepted, ctl.rejections = 0.0, 50.0
    ctl.current = None
    assert _explorations(ctl, ["a", "b"], 40) == [32]  # back to the first interval


def test_no_exploration_where_the_measured_costs_rule_drafting_out_whatever_the_acceptance() -> None:
    ctl = DraftLenController(max_k=8, explore_every=4)
    _measured(ctl)
    ctl.accepted, ctl.rejections = 0.0, 50.0
    # batch 256 is compute-bound 4x over (knee 64): a verified draft token costs what a plain step's token
    # does, plus the draft pass, even if it is always accepted
    assert ctl.drafting_ruled_out(256)
    assert _explorations(ctl, [f"r{i}" for i in range(256)], 200) == []
    # batch 2 is memory-bound: a draft token is nearly free and would pay if accepted: it is explored
    assert not ctl.drafting_ruled_out(2)
    assert _explorations(ctl, ["a", "b"], 8) == [4]


def test_a_fixed_draft_len_never_changes() -> None:
    ctl = DraftLenController(max_k=8, fixed=3)
    ctl.observe_acceptance("a", 4, 0)
    assert ctl.plan(["a", "b"]) == [3, 3]


def test_the_presets_reproduce_the_seed_figures_at_batch_1() -> None:
    seventy = PRESETS["llama70b-1b-h200"]
    assert seventy.predicted_tokens_per_second(1, 0) == pytest.approx(51.14)
    assert seventy.predicted_tokens_per_second(1, 10) == pytest.approx(146.05, rel=1e-3)
    big = PRESETS["llama405b-3b-4xh200"]
    assert big.predicted_tokens_per_second(1, 10) == pytest.approx(120.75, rel=1e-3)


def test_a_spread_of_alphas_gets_a_capped_plan_as_good_as_the_best_uniform_one() -> None:
    # The 405B preset's per-prompt spread at batch 32: drafting 10 tokens for the best few sequences would
    # cost ten draft passes; the cap keeps the plan within 5 % of the best uniform draft length (the costs are
    # known at a few sizes only).
    preset = PRESETS["llama405b-3b-4xh200"]
    rng = random.Random(3)
    alphas = [preset.acceptance.draw(rng) for _ in range(32)]
    ctl = DraftLenController(max_k=10, hysteresis=0.0)
    _measured(ctl, preset.target, preset.draft)
    plan = ctl.choose_plan(group_alphas(alphas), None)
    ks = [ctl.draft_len_at(a, plan) for a in alphas]

    def rate(lengths: list[int]) -> float:
        tokens = sum(expected_tokens_per_step(a, k) for a, k in zip(alphas, lengths, strict=True))
        seconds = preset.draft.draft_seconds(lengths) + preset.target.seconds(sum(k + 1 for k in lengths))
        return tokens / seconds

    assert rate(ks) >= 0.95 * max(rate([k] * 32) for k in range(11))


def test_a_fixed_cost_per_draft_call_makes_the_best_draft_length_longer() -> None:
    # Each draft call costs 6 ms on top of its passes (a host-side drafter, a launch). Spread over passes as
    # if a pass cost call / k, short drafts would look cheap; by passes, the controller sees that once the
    # call's cost is paid, more passes are cheap, and drafts what the true costs make best.
    overhead = 0.006

    def draft_seconds(lens: list[int]) -> float:
        return (overhead if max(lens) else 0.0) + DRAFT.draft_seconds(lens)

    def rate(k: int) -> float:
        return expected_tokens_per_step(0.8, k) / (draft_seconds([k]) + TARGET.seconds(k + 1))

    best = max(range(11), key=rate)
    ctl = DraftLenController(max_k=10, hysteresis=0.0)
    for tokens in (1, 2, 4, 8, 11, 16):
        ctl.verify_curve.observe(tokens, TARGET.seconds(tokens))
    for k in range(1, 11):
        for _ in range(3):
            ctl.draft_cost.observe(k, 1, draft_seconds([k]))
    plan = ctl.choose_plan({0.8: 1}, None)
    assert ctl.draft_len_at(0.8, plan) == best
    assert best >= _best_uniform_k(0.8, 1, 10)


def test_the_first_steps_warm_up_is_not_taken_for_the_cost_of_drafting() -> None:
    ctl = DraftLenController(max_k=10)
    ctl.accepted, ctl.rejections = 8.0, 2.0
    ids = ["a"]
    ks = ctl.plan(ids)
    # the first call took 100x its cost (a first forward's allocations, a cold cache)
    ctl.observe_costs(ks, 100 * DRAFT.draft_seconds(ks), ks[0] + 1, 100 * TARGET.seconds(ks[0] + 1))
    _simulate(ctl, 1, [0.8], 30, random.Random(4))
    estimate = ctl.draft_cost.estimator()
    for k in ctl.draft_cost.by_passes:
        assert estimate(k, 1) == pytest.approx(DRAFT.draft_seconds([k]))
    assert ctl.draft_len_at(0.8, ctl.choose_plan({0.8: 1}, None)) == _best_uniform_k(0.8, 1, 10)


def test_the_controller_retries_a_long_draft_whose_first_call_was_slow_and_settles_on_it() -> None:
    ctl = DraftLenController(max_k=8, hysteresis=0.0)
    ctl.accepted, ctl.rejections = 9.0, 1.0
    first_call = {8: True}

    def draft_seconds(ks: list[int]) -> float:
        seconds = DRAFT.draft_seconds(ks)
        if max(ks) == 8 and first_call.pop(8, False):
            return 3 * seconds  # the first 8-pass call is slow
        return seconds

    rng = random.Random(5)
    ids = ["a"]
    for k in (1, 2, 4, 8):  # every draft length measured; 8 once, slowly
        for _ in range(1 if k == 8 else 3):
            ctl.draft_cost.observe(k, 1, draft_seconds([k]))
    for tokens in (1, 2, 3, 5, 9):
        for _ in range(3):
            ctl.verify_curve.observe(tokens, TARGET.seconds(tokens))
    caps = []
    for _ in range(40):
        ks = ctl.plan(ids)
        assert ctl.current is not None
        caps.append(ctl.current[1])
        ctl.observe_costs(ks, draft_seconds(ks), ks[0] + 1, TARGET.seconds(ks[0] + 1))
        accepted = 0
        while accepted < ks[0] and rng.random() < 0.9:
            accepted += 1
        ctl.observe_acceptance("a", ks[0], accepted)
    assert _best_uniform_k(0.9, 1, 8) == 8
    assert caps[-10:] == [8] * 10


def test_a_step_that_fed_a_prompt_is_not_taken_for_the_cost_of_its_draft_and_verify_calls() -> None:
    ctl = DraftLenController(max_k=8, warmup_steps=0)
    for _ in range(5):
        ctl.observe_costs([4], 0.004, 5, 0.006)
        ctl.observe_costs(
            [4], 0.009, 5, 0.015, prefills=True
        )  # a new prompt rode in this step: twice as dear
    assert ctl.verify_curve.estimate(5) == pytest.approx(0.006)
    assert ctl.draft_cost.estimator()(4, 1) == pytest.approx(0.004)


def test_when_nearly_every_step_feeds_a_prompt_those_steps_are_measured_all_the_same() -> None:
    ctl = DraftLenController(max_k=8, warmup_steps=0, max_prefill_skips=8)
    for _ in range(3 * 9):
        ctl.observe_costs([2, 2], 0.003, 6, 0.010, prefills=True)
    assert ctl.verify_curve.confirmed  # one in nine measured: enough to plan from
    assert ctl.verify_curve.estimate(6) == pytest.approx(0.010)
    assert ctl.draft_cost.known


def test_a_padded_backend_gets_one_draft_length_for_every_row_and_is_measured_at_its_padded_size() -> None:
    """A padded batch costs its rows times the longest draft: drafting 8 for one row and 2 for the other
    costs what drafting 8 for both does, so the choice is among uniform lengths (a packed backend drafts
    more for the row that accepts more)."""
    packed = DraftLenController(max_k=8, hysteresis=0.0)
    padded = DraftLenController(max_k=8, hysteresis=0.0, padded=True)
    ids = [f"good{i}" for i in range(16)] + [f"poor{i}" for i in range(16)]  # 32 rows: compute-bound
    for ctl in (packed, padded):
        _measured(ctl)
        ctl.accepted, ctl.rejections = 8.0, 2.0
        for _ in range(20):
            for rid in ids:
                ctl.observe_acceptance(rid, 4, 4 if rid.startswith("good") else 0)
    ks = packed.plan(ids)
    assert ks[0] > ks[-1]
    ks = padded.plan(ids)
    assert len(set(ks)) == 1
    assert ks[0] > 0

    ctl = DraftLenController(max_k=8, warmup_steps=0, padded=True)
    for _ in range(3):
        ctl.observe_costs([6, 2], 0.006, 10, 0.009)  # computed as 2 rows of 7 tokens, 6 passes over 2 rows
    assert ctl.verify_curve.estimate(14) == pytest.approx(0.009)
    assert ctl.draft_cost.estimator()(6, 2) == pytest.approx(0.006)
