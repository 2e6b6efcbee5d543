"""Measured call costs for draftLen: auto (core/cost_curves.py): a size's typical time, what is trusted, how
sizes and pass counts not measured (or measured long ago, or unluckily) are estimated.

Synthetic measurements only; nothing here is timed.
"""

from __future__ import annotations

import pytest
from specdeploy_server.core.cost_curves import CostCurve, DraftCost


def test_cost_curve_interpolates_and_is_optimistic_outside_what_it_measured() -> None:
    curve = CostCurve()
    curve.observe(10, 1.0)
    assert curve.estimate(40) == 1.0  # one point: flat above
    assert curve.estimate(5) == pytest.approx(0.5)  # proportional below
    curve.observe(20, 2.0)
    assert curve.estimate(15) == pytest.approx(1.5)
    assert curve.estimate(40) == pytest.approx(4.0)  # the last segment's slope above


def test_a_draft_call_cost_is_estimated_by_its_passes_from_the_measured_pass_counts() -> None:
    cost = DraftCost()
    for _ in range(3):
        cost.observe(2, 4, 0.003)  # a call: 1 ms fixed + 1 ms per pass
        cost.observe(8, 4, 0.009)
    estimate = cost.estimator()
    assert estimate(2, 4) == pytest.approx(0.003)
    assert estimate(4, 4) == pytest.approx(0.005)  # between: linear in the passes
    assert estimate(10, 4) == pytest.approx(0.011)  # above: the per-pass slope of the last two
    assert estimate(1, 4) == pytest.approx(0.0015)  # below: in proportion (optimistic: tried, then known)
    only = DraftCost()
    only.observe(4, 1, 0.004)
    assert only.estimator()(8, 1) == pytest.approx(0.008)  # one pass count: in proportion


def test_an_outlier_among_a_sizes_first_measurements_is_gone_at_the_next_one() -> None:
    curve = CostCurve()
    curve.observe(8, 0.5)  # an outlier
    curve.observe(8, 0.01)
    assert curve.estimate(8) == pytest.approx(0.01)
    for _ in range(5):
        curve.observe(8, 0.01)
    curve.observe(8, 0.5)  # a trusted size follows a slower measurement slowly
    assert curve.estimate(8) < 0.05


def test_a_size_that_usually_takes_longer_than_its_fastest_time_is_estimated_at_its_typical_time() -> None:
    """On a contended CPU a call is now and then as fast as alone and usually slower: a draft length pays
    what its calls usually take, so the estimate follows the usual time, not the fastest."""
    curve = CostCurve()
    for seconds in (0.013, 0.040, 0.038, 0.013, 0.041, 0.042, 0.039, 0.014, 0.040):
        curve.observe(24, seconds)
    assert curve.estimate(24) == pytest.approx(0.039)  # the median (a lower envelope said 0.013)
    for _ in range(9):  # the contention ends: the estimate follows within a window
        curve.observe(24, 0.013)
    assert curve.estimate(24) == pytest.approx(0.013)


def test_a_size_beyond_the_trusted_ones_is_measured_not_extrapolated_and_one_between_them_is_retried() -> (
    None
):
    curve = CostCurve()
    for _ in range(3):
        curve.observe(128, 0.04)
        curve.observe(16, 0.02)
    curve.observe(1280, 0.4)  # once, above every trusted size: used (flat above 128 would say 0.04)
    assert curve.estimate(640) == pytest.approx(0.04 + (0.4 - 0.04) * (640 - 128) / (1280 - 128))
    curve.observe(64, 0.5)  # once, between trusted sizes (maybe an unlucky measurement): left out
    assert curve.estimate(64) == pytest.approx(max(0.02, 0.04 * 64 / 128))


def test_a_size_measured_slower_than_a_larger_one_counts_at_the_larger_ones_time() -> None:
    curve = CostCurve()
    for _ in range(3):
        curve.observe(8, 0.05)  # interfered with, every time
        curve.observe(16, 0.02)
    assert curve.estimate(8) == pytest.approx(0.02)
    cost = DraftCost()
    for _ in range(3):
        cost.observe(4, 1, 0.009)  # four passes measured slower than six
        cost.observe(6, 1, 0.006)
    assert cost.estimator()(4, 1) == pytest.approx(0.006)


def test_a_draft_length_measured_slow_once_is_estimated_from_the_trusted_ones_until_known() -> None:
    """An unlucky first call of a pass count (a shape run for the first time) must not rule that draft
    length out for good: until the pass count is trusted it counts at no more than the trusted pass counts
    make it, so it is tried again, and from then on its typical time is used."""
    cost = DraftCost()
    for _ in range(3):
        for passes in (2, 3, 4):
            cost.observe(passes, 1, 0.001 + 0.001 * passes)  # 1 ms per call + 1 ms per pass
    cost.observe(8, 1, 0.014)  # once, 40 % above its true 10 ms
    assert cost.estimator()(8, 1) == pytest.approx(0.009)  # along the trusted slope (1 ms per pass from 4)
    cost.observe(6, 1, 0.011)  # once, between trusted 4 and untrusted 8: the trusted extrapolation (7 ms)
    assert cost.estimator()(6, 1) == pytest.approx(0.007)
    assert cost.estimator()(3, 1) == pytest.approx(0.004)  # a trusted count keeps its own figure
    for seconds in (0.012, 0.013):  # slower every time: now trusted, at its median
        cost.observe(8, 1, seconds)
    assert cost.estimator()(8, 1) == pytest.approx(0.013)


def test_a_size_just_above_the_trusted_ones_measured_slow_once_is_capped_by_their_slope_until_trusted() -> (
    None
):
    curve = CostCurve()
    for _ in range(3):
        curve.observe(4, 0.005)
        curve.observe(5, 0.0055)
    curve.observe(9, 0.02)  # once, an unlucky first call: the trusted slope says 0.0075
    assert curve.estimate(9) == pytest.approx(0.0075)
    curve.observe(40, 0.2)  # far above (more than a doubling): the measurement is used as it is
    assert curve.estimate(40) == pytest.approx(0.2)
    for _ in range(2):  # measured slow three times: trusted, at its median
        curve.observe(9, 0.02)
    assert curve.estimate(9) == pytest.approx(0.02)


def test_a_size_measured_while_the_machine_was_busy_is_measured_again_once_its_figure_is_stale() -> None:
    """A draft length measured during someone else's load looked dear for good: not chosen, never measured
    again. Once ``stale_after`` other measurements have passed, it is estimated from the trusted ones again
    (so it is tried) and its next measurement starts it afresh."""
    cost = DraftCost()
    for _ in range(3):
        cost.observe(8, 1, 0.020)  # measured while the machine was busy: twice its true 10 ms
        for passes in (2, 3, 4):
            cost.observe(passes, 1, 0.001 + 0.001 * passes)
    assert cost.estimator()(8, 1) == pytest.approx(0.020)
    for _ in range(40):  # the plan keeps drafting 2 to 4 tokens
        for passes in (2, 3, 4):
            cost.observe(passes, 1, 0.001 + 0.001 * passes)
    assert cost.estimator()(8, 1) == pytest.approx(0.009)  # stale: from the trusted slope, so it is tried
    cost.observe(8, 1, 0.010)  # measured again, now that the machine is quiet: afresh
    assert cost.estimator()(8, 1) == pytest.approx(0.009)
    cost.observe(8, 1, 0.010)
    cost.observe(8, 1, 0.010)
    assert cost.estimator()(8, 1) == pytest.approx(0.010)  # trusted again, at its new figure

    curve = CostCurve(stale_after=10)
    for _ in range(3):
        curve.observe(16, 0.02)
        curve.observe(4, 0.015)
        curve.observe(8, 0.05)  # busy
    for _ in range(12):
        curve.observe(16, 0.02)
        curve.observe(4, 0.015)
    assert curve.estimate(8) == pytest.approx(max(0.015, 0.02 * 8 / 16))  # stale, between: left out


def test_a_draft_calls_cost_is_fitted_as_fixed_plus_per_pass_so_one_noisy_pass_count_moves_little() -> None:
    cost = DraftCost()
    for _ in range(3):
        for passes in range(1, 9):
            seconds = 0.001 + 0.001 * passes  # 1 ms per call + 1 ms per pass
            cost.observe(passes, 1, 2 * seconds if passes == 6 else seconds)  # 6 passes: always interfered
    estimate = cost.estimator()
    for passes in range(1, 11):
        assert estimate(passes, 1) == pytest.approx(0.001 + 0.001 * passes)
