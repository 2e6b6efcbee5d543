"""Measured pass costs from `trtllm-llmapi` servers to the next pods' schedule: the server's summaries, the
operator's windows and `status.speculation.passCosts`, the ConfigMap's `measured.json`, and the server
reading it back (the contract between the two)."""

from __future__ import annotations

import asyncio
import copy
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.builders import render_children
from specdeploy_operator.builders.serverconfig import config_digest
from specdeploy_operator.controller import passcosts
from specdeploy_operator.controller.speculation import (
    SpeculationSampler,
    meaningful_change,
    parse_sample,
    window,
)

# The test environment installs both packages (make venv): this contract must never be skipped.
from specdeploy_server.backends.llmapi_measured import read_measured, schedule_costs
from specdeploy_server.backends.llmapi_schedule import COST_PRESET
from specdeploy_server.backends.llmapi_step_costs import Iteration, StepCostCollector, WidthRule, size_bucket
from specdeploy_server.backends.step_costs import expected_tokens_per_step
from specdeploy_server.config import ServerConfig
from specdeploy_server.metrics import ServerMetrics

from tests.unit.builder_examples import SETTINGS, example_body, parsed_example
from tests.unit.test_speculation_status import status_of

NOW = datetime(2026, 11, 27, 16, 0, tzinfo=UTC)
PYTORCH = "12-draft-target-llama405b-8b-2x8xh100"


class Server:
    """A real server metrics registry with the trtllm-llmapi pass-cost collector, fed iterations."""

    def __init__(self) -> None:
        self.metrics = ServerMetrics("target")
        self.costs = StepCostCollector("target", WidthRule(4, {1: 4, 8: 0}, "lower"))
        self.metrics.registry.register(self.costs)

    def iterations(self, n: int, *, generation: int, seconds: float, draft_seconds: float = 0.0) -> None:
        for _ in range(n):
            self.costs.observe(Iteration(seconds, generation, 0, generation, generation, draft_seconds))
        self.metrics.on_iterations(n * generation, n * generation)

    def text(self) -> str:
        return self.metrics.render().decode()


def test_the_operator_reads_the_pass_costs_the_server_exports() -> None:
    server = Server()
    server.iterations(10, generation=2, seconds=0.012, draft_seconds=0.002)
    sample = parse_sample(server.text(), at=1.0)
    tokens = size_bucket(2 * 5)
    assert sample.passes[("target", tokens)] == pytest.approx((10, 0.1))
    assert sample.passes[("draft", 2)] == pytest.approx((40, 0.02))  # 4 passes an iteration
    assert (sample.steps, sample.speculating) == (20, 20)


def test_a_window_costs_each_size_over_the_pods_and_skips_a_restarted_one() -> None:
    a, b = Server(), Server()
    before = {"a": parse_sample(a.text(), 0.0), "b": parse_sample(b.text(), 0.0)}
    a.iterations(6, generation=2, seconds=0.010)
    b.iterations(6, generation=2, seconds=0.014)
    b.iterations(3, generation=9, seconds=0.050)  # 9 active: off, 9 tokens, only 3 passes
    restarted = Server()
    before["c"] = parse_sample(b.text(), 0.0)  # its counters then go down
    after = {"a": parse_sample(a.text(), 30.0), "b": parse_sample(b.text(), 30.0)}
    after["c"] = parse_sample(restarted.text(), 30.0)
    win = window(before, after, failed=0)
    assert win is not None
    assert (win.pods, win.skipped) == (2, 1)
    figures = win.figures(NOW)["passCosts"]
    assert figures == {"target": [{"tokens": size_bucket(10), "seconds": 0.012, "count": 12}]}  # 9: too few


def test_the_sampler_publishes_the_pass_costs_the_pods_measured_and_the_status_keeps_them() -> None:
    servers = {"http://p1/metrics": Server(), "http://p2/metrics": Server()}
    clock = [0.0]

    async def fetch(url: str) -> str:
        return servers[url].text()

    sampler = SpeculationSampler(fetch, lambda: NOW, monotonic=lambda: clock[0])
    targets = {("ns", "dep"): [(url.split("/")[2], url) for url in servers]}

    def tick() -> list[tuple[str, str]]:
        clock[0] += 30.0
        return asyncio.run(sampler.sample(targets))

    assert tick() == []  # the baseline
    for server in servers.values():
        server.iterations(5, generation=2, seconds=0.010, draft_seconds=0.002)
    assert tick() == [("ns", "dep")]
    published = sampler.published(("ns", "dep"))
    assert published is not None
    assert published["passCosts"] == {
        "target": [{"tokens": size_bucket(10), "seconds": 0.008, "count": 10}],
        "draft": [{"sequences": 2, "seconds": 0.0005, "count": 40}],
    }
    status: Any = status_of(None, speculation=published)
    assert status["speculation"]["passCosts"] == published["passCosts"]


def test_a_new_size_or_a_tenth_slower_pass_is_worth_a_status_write() -> None:
    old = {"target": [{"tokens": 11, "seconds": 0.010, "count": 20}]}
    assert not passcosts.changed(old, {"target": [{"tokens": 11, "seconds": 0.0105, "count": 9}]})
    assert passcosts.changed(old, {"target": [{"tokens": 11, "seconds": 0.0115, "count": 9}]})
    assert passcosts.changed(old, {"draft": [{"sequences": 2, "seconds": 0.001, "count": 9}]})
    assert not passcosts.changed(old, {})
    base = {"tokensPerStep": 2.0, "draftLength": 4.0, "tokensPerSecond": 100.0, "pods": 1, "podsSkipped": 0}
    assert meaningful_change(
        {**base, "passCosts": old}, {**base, "passCosts": {"target": [{**old["target"][0], "seconds": 0.02}]}}
    )
    assert not meaningful_change({**base, "passCosts": old}, base)


def test_the_status_keeps_every_size_at_its_latest_measurement() -> None:
    costs = [{"tokens": 11, "seconds": 0.010, "count": 20}, {"tokens": 45, "seconds": 0.030, "count": 9}]
    first = status_of(None, speculation={"acceptanceRate": 0.6, "passCosts": {"target": costs}})
    newer = {"tokens": 45, "seconds": 0.040, "count": 30}
    second = status_of(first, speculation={"acceptanceRate": 0.7, "passCosts": {"target": [newer]}})
    speculation: Any = second["speculation"]
    assert speculation["acceptanceRate"] == 0.7
    assert speculation["passCosts"] == {"target": [costs[0], newer]}
    third: Any = status_of(second, speculation={"acceptanceRate": 0.7})  # no pass measured: all kept
    assert third["speculation"]["passCosts"] == speculation["passCosts"]


FIGURES = {
    "acceptanceRate": 0.65,
    "draftLength": 2.4,
    "speculatingFraction": 0.8,
    "measuredAt": "2026-11-27T15:59:00Z",
    "passCosts": {
        "target": [
            {"tokens": 6, "seconds": 0.021, "count": 40},
            {"tokens": 90, "seconds": 0.05, "count": 12},
        ],
        "draft": [{"sequences": 2, "seconds": 0.0015, "count": 160}],
    },
}


def _withstatus_of(stem: str, figures: dict[str, Any] | None, **speculative: Any) -> SpeculativeDeployment:
    body = copy.deepcopy(example_body(stem))
    body["spec"]["speculative"].update(speculative)
    if figures is not None:
        body["status"] = {"speculation": figures}
    return parsed_example(body)


def _configmap(sdep: SpeculativeDeployment) -> dict[str, Any]:
    return next(c for c in render_children(sdep, SETTINGS) if c["kind"] == "ConfigMap")


def test_the_configmap_hands_the_measured_figures_to_the_next_pods_without_restarting_any(
    tmp_path: Path,
) -> None:
    fresh = _configmap(_withstatus_of(PYTORCH, None))
    assert "measured.json" not in fresh["data"]  # a new deployment: the server starts from the preset
    measured = _configmap(_withstatus_of(PYTORCH, FIGURES))
    config = ServerConfig.model_validate(json.loads(measured["data"]["server.yaml"]))
    assert str(config.speculative.measured_costs_file) == "/etc/specdeploy/measured.json"
    assert config_digest(measured) == config_digest(fresh)  # new figures restart no pod
    # The server reads back exactly what the status says (the contract).
    path = tmp_path / "measured.json"
    path.write_text(measured["data"]["measured.json"])
    read = read_measured(path)
    assert read is not None
    assert read.acceptance_rate == 0.65
    assert read.draft_tokens_per_speculating_step == 3.0  # 2.4 per step, 80 % of steps drafted
    assert [(p.tokens, p.seconds) for p in read.target_pass] == [(6, 0.021), (90, 0.05)]
    assert [(p.sequences, p.seconds) for p in read.draft_pass] == [(2, 0.0015)]
    costs = schedule_costs(read, COST_PRESET, max_draft_len=4, drafts_with_a_model=True)
    assert costs.sources == {"acceptance": "measured", "target": "measured", "draft": "measured"}
    assert expected_tokens_per_step(costs.alpha, 3) == pytest.approx(1 + 0.65 * 3)
    assert costs.target.seconds(6) == 0.021


def test_only_a_trtllm_llmapi_server_choosing_its_draft_length_gets_measured_figures() -> None:
    for sdep in (
        _withstatus_of(PYTORCH, FIGURES, draftLen=3),
        _withstatus_of(
            "tensorrt/01-draft-target-llama70b-8b-h100", FIGURES
        ),  # backend tensorrt: our own loop
    ):
        configmap = _configmap(sdep)
        assert "measured.json" not in configmap["data"]
        assert "measuredCostsFile" not in json.loads(configmap["data"]["server.yaml"])["speculative"]
