"""status.speculation: figures from the servers' own counters (the real server metrics module renders the
text the operator parses), windows between scrapes, bounded writes, and the low-acceptance alarm."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

import pytest
from specdeploy_operator.api import ConditionStatus, ConditionType, Reason
from specdeploy_operator.controller.speculation import (
    PodSample,
    SpeculationSampler,
    effectiveness_condition,
    meaningful_change,
    parse_sample,
    window,
)
from specdeploy_operator.controller.status import (
    ConditionSpec,
    EngineObservation,
    ServingObservation,
    deployment_status,
)
from specdeploy_server.core.scheduler_types import StepSpeculation
from specdeploy_server.metrics import ServerMetrics

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


class Server:
    """A real server metrics registry driven as the scheduler and the request runs drive it."""

    def __init__(self) -> None:
        self.metrics = ServerMetrics("target")

    def steps(self, sequence_steps: int, drafted: int, accepted: int, generated: int) -> None:
        # Every sequence of these steps drafted (accepted_counts sums to the sequences that drafted).
        self.metrics.on_speculation(
            StepSpeculation(sequence_steps, drafted, accepted, [sequence_steps, 0, 0])
        )
        self.metrics.generation_tokens.labels("target").inc(generated)

    def text(self) -> str:
        return self.metrics.render().decode()


def test_the_operator_reads_the_counters_the_server_exports_under_their_names() -> None:
    server = Server()
    server.steps(sequence_steps=10, drafted=40, accepted=30, generated=40)
    sample = parse_sample(server.text(), at=5.0)
    assert sample == PodSample(at=5.0, drafted=40, accepted=30, steps=10, generated=40, speculating=10)


def test_garbage_is_not_a_sample() -> None:
    with pytest.raises(ValueError, match=r".+"):
        parse_sample("this is { not prometheus", at=0.0)


def test_a_window_sums_deltas_over_pods_seen_at_both_ends_and_skips_restarted_ones() -> None:
    before = {
        "a": PodSample(0.0, drafted=100, accepted=80, steps=50, generated=130),
        "b": PodSample(0.0, drafted=500, accepted=100, steps=200, generated=300),
        "c": PodSample(0.0, drafted=10, accepted=5, steps=5, generated=10),
    }
    after = {
        "a": PodSample(
            30.0, drafted=500, accepted=380, steps=150, generated=530
        ),  # +400 / +300 / +100 / +400
        "b": PodSample(30.5, drafted=4, accepted=1, steps=2, generated=3),  # restarted: counters went down
        "c": PodSample(30.0, drafted=10, accepted=5, steps=5, generated=10),  # idle pod: counted, no deltas
        "d": PodSample(30.0, drafted=7, accepted=7, steps=1, generated=8),  # new pod: no window yet
    }
    win = window(before, after, failed=1)
    assert win is not None
    assert (win.pods, win.skipped) == (2, 2)  # a and c; b restarted, one pod failed to answer
    figures = win.figures(NOW)
    assert figures["acceptanceRate"] == 0.75
    assert figures["tokensPerStep"] == 4.0
    assert figures["draftLength"] == 4.0
    assert figures["tokensPerSecond"] == round(400 / 30, 1)
    assert figures["measuredAt"] == "2026-11-23T12:00:00Z"
    assert "speculatingFraction" not in figures


def test_an_idle_window_has_no_figures() -> None:
    same = {"a": PodSample(0.0, 10, 5, 5, 10)}
    later = {"a": PodSample(30.0, 10, 5, 5, 10)}
    assert window(same, later, failed=0) is None
    assert window({}, later, failed=0) is None


def test_no_drafting_reports_tokens_per_step_without_an_acceptance_rate() -> None:
    win = window({"a": PodSample(0.0)}, {"a": PodSample(10.0, steps=20, generated=20)}, failed=0)
    assert win is not None
    figures = win.figures(NOW)
    assert "acceptanceRate" not in figures
    assert figures["tokensPerStep"] == 1.0
    assert effectiveness_condition(figures, low=0.2) is None


def test_only_meaningful_changes_are_worth_a_write() -> None:
    base = {
        "acceptanceRate": 0.7,
        "tokensPerStep": 3.0,
        "draftLength": 4.0,
        "tokensPerSecond": 100.0,
        "pods": 2,
    }
    assert meaningful_change(None, base)
    assert not meaningful_change(base, {**base, "acceptanceRate": 0.71, "tokensPerStep": 3.05})
    assert not meaningful_change(base, {**base, "tokensPerSecond": 108.0})
    assert meaningful_change(base, {**base, "acceptanceRate": 0.68})
    assert meaningful_change(base, {**base, "tokensPerStep": 3.3})
    assert meaningful_change(base, {**base, "tokensPerSecond": 115.0})
    assert meaningful_change(base, {**base, "pods": 3})


def test_low_acceptance_while_drafting_enough_is_an_alarm_and_a_few_tokens_judge_nothing() -> None:
    low = {"acceptanceRate": 0.1, "tokensPerStep": 1.1, "windowSeconds": 30, "_drafted": 400}
    cond = effectiveness_condition(low, low=0.2)
    assert cond is not None
    assert (cond.type, cond.status, cond.reason) == ("SpeculationEffective", "False", "LowAcceptance")
    assert "10%" in cond.message
    assert effectiveness_condition({**low, "_drafted": 8}, low=0.2) is None  # no claim either way
    assert effectiveness_condition({**low, "acceptanceRate": 0.6, "_drafted": 8}, low=0.2) is None
    healthy = effectiveness_condition({**low, "acceptanceRate": 0.6}, low=0.2)
    assert healthy is not None
    assert (healthy.status, healthy.reason) == ("True", "AcceptanceHealthy")


class Pods:
    """Servers behind URLs for the sampler's fetch; a URL in `down` fails like an unreachable pod."""

    def __init__(self, names: list[str]) -> None:
        self.servers = {f"http://{n}/metrics": Server() for n in names}
        self.down: set[str] = set()

    async def fetch(self, url: str) -> str:
        if url in self.down:
            raise OSError("connection refused")
        return self.servers[url].text()

    def targets(self) -> dict[tuple[str, str], list[tuple[str, str]]]:
        return {("ns", "dep"): [(url.split("/")[2], url) for url in self.servers]}


@pytest.fixture
def clock() -> list[float]:
    return [0.0]


def test_the_sampler_publishes_after_two_scrapes_then_only_on_change_and_never_while_idle(
    clock: list[float],
) -> None:
    pods = Pods(["p1", "p2"])
    sampler = SpeculationSampler(pods.fetch, lambda: NOW, monotonic=lambda: clock[0])
    key = ("ns", "dep")

    def tick(seconds: float = 30.0) -> list[tuple[str, str]]:
        clock[0] += seconds
        return asyncio.run(sampler.sample(pods.targets()))

    def load(accept: int) -> None:
        for server in pods.servers.values():
            server.steps(sequence_steps=100, drafted=400, accepted=accept, generated=100 + accept)

    assert tick() == []  # the first scrape only sets the baseline
    assert tick() == []  # idle: nothing to publish
    load(accept=300)
    assert tick() == [key]
    published = sampler.published(key)
    assert published is not None
    assert published["acceptanceRate"] == 0.75
    assert published["pods"] == 2
    assert published["speculatingFraction"] == 1.0  # the servers export specdeploy_speculating_steps
    assert "_drafted" not in published
    load(accept=302)  # the same figures, give or take: no write
    assert tick() == []
    assert tick() == []  # idle again: the published figures stay, no write
    load(accept=40)  # the draft stopped fitting
    assert tick() == [key]
    cond = sampler.condition(key, low=0.2)
    assert cond is not None
    assert cond.reason == "LowAcceptance"
    pods.down.add("http://p2/metrics")  # one pod stops answering: skipped and counted, the other still counts
    load(accept=40)
    assert tick() == [key]
    published = sampler.published(key)
    assert published is not None
    assert (published["pods"], published["podsSkipped"]) == (1, 1)
    assert sampler.scrape_failures == 1


def test_the_tail_of_a_burst_leaves_the_verdict_of_the_traffic_before_it(clock: list[float]) -> None:
    pods = Pods(["p1"])
    sampler = SpeculationSampler(pods.fetch, lambda: NOW, monotonic=lambda: clock[0])
    key = ("ns", "dep")
    server = pods.servers["http://p1/metrics"]

    def tick() -> list[tuple[str, str]]:
        clock[0] += 3.0
        return asyncio.run(sampler.sample(pods.targets()))

    tick()
    assert sampler.condition(key, low=0.2) is None  # nothing measured: no claim
    server.steps(sequence_steps=100, drafted=400, accepted=20, generated=120)
    assert tick() == [key]
    cond = sampler.condition(key, low=0.2)
    assert cond is not None
    assert cond.reason == "LowAcceptance"
    # The last request's few steps, one lucky acceptance among them: published, but too few to judge by.
    server.steps(sequence_steps=3, drafted=12, accepted=6, generated=9)
    assert tick() == [key]
    published = sampler.published(key)
    assert published is not None
    assert published["acceptanceRate"] == 0.5
    cond = sampler.condition(key, low=0.2)
    assert cond is not None
    assert (cond.reason, "5%" in cond.message) == ("LowAcceptance", True)
    # Enough traffic again, and the draft fits now: the verdict turns, and that alone is worth a write.
    server.steps(sequence_steps=100, drafted=400, accepted=300, generated=400)
    assert tick() == [key]
    cond = sampler.condition(key, low=0.2)
    assert cond is not None
    assert cond.reason == "AcceptanceHealthy"


def status_of(previous: dict[str, object] | None, **kw: object) -> dict[str, object]:
    """`deployment_status` of a ready deployment with no engines, `kw` its speculation arguments."""
    return deployment_status(
        generation=1,
        desired_replicas=1,
        engines=list[EngineObservation](),
        serving=ServingObservation(None, True, []),
        selector="app=x",
        endpoint="http://x",
        gpus_per_replica=0,
        previous=previous,
        keep_previous=1,
        now=NOW,
        **kw,  # type: ignore[arg-type]
    )


def test_status_carries_published_figures_and_keeps_them_when_the_operator_has_none_yet() -> None:
    figures = {"acceptanceRate": 0.7, "tokensPerStep": 3.1, "measuredAt": "2026-11-23T11:59:00Z"}
    cond = ConditionSpec(
        ConditionType.SPECULATION_EFFECTIVE, ConditionStatus.TRUE, Reason.ACCEPTANCE_HEALTHY, "acceptance 70%"
    )
    first = status_of(None, speculation=figures, speculation_condition=cond)
    assert first["speculation"] == figures
    conditions = {c["type"]: c for c in first["conditions"]}  # type: ignore[attr-defined]
    assert conditions["SpeculationEffective"]["reason"] == "AcceptanceHealthy"
    # A restarted operator has measured nothing: the status it renders is the same, so nothing is written.
    again = status_of(first)
    assert again == first
