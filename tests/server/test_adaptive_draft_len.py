"""draftLen: auto picks k from acceptance and measured costs."""

from __future__ import annotations

import pytest
from specdeploy_server.core.adaptive import DraftLenController, choose_draft_len, expected_tokens_per_step


def test_expected_tokens_per_step_matches_the_geometric_formula() -> None:
    assert expected_tokens_per_step(0.0, 5) == 1.0
    assert expected_tokens_per_step(1.0, 5) == 6.0
    assert expected_tokens_per_step(0.5, 2) == pytest.approx(1.75)


def test_high_acceptance_and_a_cheap_draft_choose_a_long_draft() -> None:
    assert choose_draft_len(0.9, draft_token_cost=0.001, verify_cost=0.03, max_k=10) >= 8


def test_low_acceptance_or_an_expensive_draft_choose_no_draft() -> None:
    assert choose_draft_len(0.05, draft_token_cost=0.01, verify_cost=0.03, max_k=10) == 0
    assert choose_draft_len(0.6, draft_token_cost=0.05, verify_cost=0.03, max_k=10) == 0


def test_controller_estimates_acceptance_and_adapts() -> None:
    ctl = DraftLenController(max_k=8, fixed=None, explore_every=1000)
    assert ctl.next_k() == 4  # no measurements yet
    for _ in range(200):
        ctl.observe_costs(draft_seconds=0.004, max_k_drafted=4, verify_seconds=0.03)
        ctl.observe_acceptance(drafted=4, accepted=4)
    assert ctl.alpha > 0.95
    assert ctl.next_k() == 8
    for _ in range(200):
        ctl.observe_acceptance(drafted=4, accepted=0)
    assert ctl.alpha < 0.05
    assert ctl.next_k() == 0


def test_controller_explores_after_choosing_no_draft_for_a_while() -> None:
    ctl = DraftLenController(max_k=8, fixed=None, explore_every=3)
    ctl.observe_costs(0.01, 1, 0.01)
    for _ in range(50):
        ctl.observe_acceptance(drafted=1, accepted=0)
    ks = [ctl.next_k() for _ in range(6)]
    assert ks == [0, 0, 1, 0, 0, 1]


def test_a_fixed_draft_len_never_changes() -> None:
    ctl = DraftLenController(max_k=8, fixed=3)
    ctl.observe_acceptance(4, 0)
    assert ctl.next_k() == 3
