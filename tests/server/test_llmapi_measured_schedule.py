"""``draft_len_schedule`` on ``trtllm-llmapi`` from measured costs: the pass costs the server reads from
TensorRT-LLM's iteration statistics (backends/llmapi_step_costs.py), the measured-costs file the next pods
start from (backends/llmapi_measured.py), and the schedule our cost model chooses from them."""

from __future__ import annotations

import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.backends.llmapi_measured import MeasuredCosts, PassCosts, read_measured, schedule_costs
from specdeploy_server.backends.llmapi_schedule import COST_PRESET, best_draft_len, draft_len_schedule
from specdeploy_server.backends.llmapi_step_costs import (
    Iteration,
    IterationStatsReader,
    StepCostCollector,
    WidthRule,
    parse_iteration,
    size_bucket,
)
from specdeploy_server.backends.step_costs import expected_tokens_per_step
from specdeploy_server.backends.trtllm_llmapi import LlmApiEngine
from specdeploy_server.config import ServerConfig

from tests.server.conftest import TinyModels, run_live
from tests.server.trtllm_double import DoubleState, trtllm_double
from tests.server.trtllm_double_drafter import Drafter, LlmRequest

__all__ = ["trtllm_double"]

#: a target that turns compute-bound at 8 tokens a pass (the preset's knee is 64) and a draft that is costly
COMPUTE_BOUND_EARLY = {
    "acceptanceRate": 0.7,
    "draftTokensPerSpeculatingStep": 4.0,
    "targetPass": [
        {"tokens": 1, "seconds": 0.02, "count": 50},
        {"tokens": 8, "seconds": 0.02, "count": 50},
        {"tokens": 64, "seconds": 0.16, "count": 50},
    ],
    "draftPass": [{"sequences": 1, "seconds": 0.004, "count": 200}],
}


def _costs(figures: dict[str, Any], *, max_draft_len: int = 4, model: bool = True) -> Any:
    measured = MeasuredCosts.model_validate(figures)
    return schedule_costs(measured, COST_PRESET, max_draft_len=max_draft_len, drafts_with_a_model=model)


# ----------------------------------------------------------------------------------- what is measured
class _Probe(Drafter):
    def prepare_draft_tokens(self, scheduled_requests: Any, resource_manager: Any = None) -> None:
        return None


@pytest.mark.parametrize("meaning", ["lower", "upper"])
def test_the_width_rule_decides_each_iteration_as_the_executor_does(meaning: str) -> None:
    schedule = {1: 4, 3: 2, 6: 0} if meaning == "lower" else {2: 4, 5: 2, 7: 1}
    _Probe.schedule_meaning = meaning
    try:
        for concurrency in (None, 5):
            probe = _Probe(4, 4, max_concurrency=concurrency, draft_len_schedule=schedule)
            rule = WidthRule(4, schedule, meaning, concurrency)  # type: ignore[arg-type]
            for active in range(1, 10):
                requests = [LlmRequest(i, i, [1], 1, 8) for i in range(active)]
                speculating = probe.should_use_spec_decode(requests)
                assert rule.drafted(active) == (probe.max_total_draft_tokens if speculating else 0)
                assert rule.verified(active) == (probe.padded_width() if speculating else 0)
    finally:
        _Probe.schedule_meaning = "lower"


def test_iteration_statistics_are_read_as_dicts_or_json_strings() -> None:
    stats = {
        "iterLatencyMS": 12.5,
        "numActiveRequests": 3,
        "inflightBatchingStats": {"numContextRequests": 0, "numGenRequests": 3},
        "specDecodingStats": {"numRequestsWithDraftTokens": 2, "iterLatencyMS": 2.5},
    }
    expected = Iteration(0.0125, 3, 0, 3, 2, 0.0025)
    assert parse_iteration(stats) == expected
    assert parse_iteration(json.dumps(stats)) == expected
    assert parse_iteration({"iter": 1}) is None
    assert parse_iteration("not json") is None


def test_generation_iterations_are_costed_by_the_tokens_the_target_verified() -> None:
    rule = WidthRule(4, {1: 4, 4: 0}, "lower")
    collector = StepCostCollector("tiny", rule)
    collector.observe(Iteration(0.010, active=2, context=0, generation=2, speculating=2, draft_seconds=0.002))
    collector.observe(Iteration(0.050, active=2, context=1, generation=1, speculating=1, draft_seconds=0.0))
    collector.observe(Iteration(0.006, active=5, context=0, generation=5, speculating=0, draft_seconds=0.0))
    registry = CollectorRegistry()
    registry.register(collector)
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    target = {
        (s.labels["tokens"], s.name): s.value for s in families["specdeploy_target_pass_seconds"].samples
    }
    # 2 requests verifying 4 + 1 positions: 10 tokens (bucket 11); the drafter's 2 ms are not the target's
    assert target[(str(size_bucket(10)), "specdeploy_target_pass_seconds_count")] == 1
    assert target[(str(size_bucket(10)), "specdeploy_target_pass_seconds_sum")] == pytest.approx(0.008)
    # 5 active: the schedule is off, 5 tokens; the iteration with a prefill is not costed
    assert target[(str(size_bucket(5)), "specdeploy_target_pass_seconds_count")] == 1
    assert len(target) == 4
    draft = {
        (s.labels["sequences"], s.name): s.value for s in families["specdeploy_draft_pass_seconds"].samples
    }
    assert draft == {
        ("2", "specdeploy_draft_pass_seconds_count"): 4,
        ("2", "specdeploy_draft_pass_seconds_sum"): 0.002,
    }


def test_the_reader_counts_sequence_steps_and_survives_a_failing_queue() -> None:
    seen: list[tuple[int, int]] = []

    class Observer:
        def on_iterations(self, sequence_steps: int, speculating_steps: int) -> None:
            seen.append((sequence_steps, speculating_steps))

    batches: list[Any] = [
        [
            {
                "iterLatencyMS": 5,
                "numActiveRequests": 3,
                "inflightBatchingStats": {"numGenRequests": 3},
                "specDecodingStats": {"numRequestsWithDraftTokens": 2},
            },
            "garbage",
        ],
    ]

    def get_stats(timeout: float) -> list[Any]:
        if not batches:
            raise RuntimeError("the executor is gone")
        return list(batches.pop())

    reader = IterationStatsReader(get_stats, StepCostCollector("tiny", WidthRule(4)))
    reader.observer = Observer()
    assert reader.read_once(0.0) == 2
    assert seen == [(3, 2)]
    assert reader.iterations == 1
    reader.start()  # the next read raises: logged, retried, never fatal
    time.sleep(0.2)
    reader.stop()


# ---------------------------------------------------------------------------------- measured -> schedule
def test_measured_pass_costs_are_flat_below_interpolated_between_and_proportional_above() -> None:
    costs = PassCosts.of([(8, 0.02), (1, 0.02), (64, 0.16)])
    assert costs is not None
    assert costs.seconds(0) == 0.0
    assert costs.seconds(1) == costs.seconds(4) == 0.02
    assert costs.seconds(36) == pytest.approx(0.02 + 0.14 * 28 / 56)
    assert costs.seconds(128) == pytest.approx(0.32)
    assert costs.draft_seconds([2, 1]) == pytest.approx(0.04)


def test_the_schedule_is_what_the_cost_model_chooses_from_the_measured_costs() -> None:
    costs = _costs(COMPUTE_BOUND_EARLY)
    assert costs.sources == {"acceptance": "measured", "target": "measured", "draft": "measured"}
    # 0.7 of 4 drafted accepted: 3.8 tokens per speculating step
    assert expected_tokens_per_step(costs.alpha, 4) == pytest.approx(1 + 0.7 * 4, rel=1e-6)
    for meaning in ("lower", "upper"):
        schedule = draft_len_schedule(4, 32, meaning, drafts_with_a_model=True, costs=costs)
        choices = [
            best_draft_len(b, 4, meaning, alpha=costs.alpha, target=costs.target, draft=costs.draft)
            for b in range(1, 33)
        ]
        rule = WidthRule(4, schedule, meaning)
        # batch 1 drafts max_draft_len in both meanings: TensorRT-LLM requires its smallest key to
        expected = [4 if b == 1 else k for b, k in enumerate(choices, start=1)]
        assert [rule.drafted(b) for b in range(1, 33)] == expected
    measured = draft_len_schedule(4, 32, "upper", drafts_with_a_model=True, costs=costs)
    preset = draft_len_schedule(4, 32, "upper", drafts_with_a_model=True)
    assert max(measured) < max(preset)  # compute-bound from 8 tokens on: it stops speculating sooner


def test_low_measured_acceptance_turns_speculation_off_at_every_batch_size_it_may() -> None:
    costs = _costs({**COMPUTE_BOUND_EARLY, "acceptanceRate": 0.02})
    assert draft_len_schedule(4, 16, "lower", drafts_with_a_model=True, costs=costs) == {1: 4, 2: 0}
    # upper bounds: off from 2 on; batch 1 keeps max_draft_len, as TensorRT-LLM requires of the smallest key
    # (its acceptance-rate gate then turns speculation off for good)
    assert draft_len_schedule(4, 16, "upper", drafts_with_a_model=True, costs=costs) == {1: 4}


def test_a_measured_target_without_a_measured_draft_already_holds_the_drafting() -> None:
    figures = {k: v for k, v in COMPUTE_BOUND_EARLY.items() if k != "draftPass"}
    assert _costs(figures).draft is None
    assert _costs(figures).sources["draft"] == "in the target pass"
    nothing = schedule_costs(None, COST_PRESET, max_draft_len=4, drafts_with_a_model=True)
    assert nothing.draft is COST_PRESET.draft
    assert nothing.sources["target"] == "preset"
    assert _costs(figures, model=False).draft is None


def test_an_unreadable_measured_file_is_logged_and_the_preset_decides(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    assert read_measured(None) is None
    assert read_measured(tmp_path / "absent.json") is None
    bad = tmp_path / "measured.json"
    bad.write_text('{"acceptanceRate": 3}')
    with caplog.at_level(logging.WARNING):
        assert read_measured(bad) is None
    assert "measured costs not used" in caplog.text
    bad.write_text("{not json")
    assert read_measured(bad) is None


# -------------------------------------------------------------------------------------- through the backend
def _config(tiny_models: TinyModels, measured: Path | None, method: str = "draftTarget") -> ServerConfig:
    model: dict[str, str] = {"target": str(tiny_models.target)}
    if method == "draftTarget":
        model["draft"] = str(tiny_models.draft_same)
    speculative: dict[str, Any] = {"method": method, "draftLen": "auto", "maxDraftLen": 4}
    if measured is not None:
        speculative["measuredCostsFile"] = str(measured)
    return ServerConfig.model_validate(
        {"model": model, "backend": "trtllm-llmapi", "speculative": speculative}
    )


@pytest.mark.parametrize("version", ["1.2.1", "1.3.0rc9"])
def test_the_llm_gets_the_schedule_of_the_measured_costs_file(
    *,
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    version: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(sys.modules["tensorrt_llm"], "__version__", version)
    meaning = "lower" if version.startswith("1.2") else "upper"
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(COMPUTE_BOUND_EARLY))
    with caplog.at_level(logging.INFO):
        build_engine(_config(tiny_models, path))
    llm = trtllm_double.llms[-1]
    expected = draft_len_schedule(4, 64, meaning, drafts_with_a_model=True, costs=_costs(COMPUTE_BOUND_EARLY))  # type: ignore[arg-type]
    assert llm.kwargs["speculative_config"].draft_len_schedule == expected
    assert expected != draft_len_schedule(4, 64, meaning, drafts_with_a_model=True)  # type: ignore[arg-type]
    assert llm.kwargs["enable_iter_perf_stats"] is True
    logged = [r for r in caplog.records if r.getMessage() == "draft_len_schedule"]
    assert logged
    assert logged[-1].__dict__["sources"]["target"] == "measured"
    build_engine(_config(tiny_models, tmp_path / "absent.json"))  # a deployment's first pods: the preset
    preset = draft_len_schedule(4, 64, meaning, drafts_with_a_model=True)  # type: ignore[arg-type]
    assert trtllm_double.llms[-1].kwargs["speculative_config"].draft_len_schedule == preset


def test_served_requests_export_measured_pass_costs_and_sequence_steps(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    engine = build_engine(_config(tiny_models, None))
    assert isinstance(engine, LlmApiEngine)
    with run_live(create_app(engine, served_model_name="tiny")) as live:
        client = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0)
        for prompt in ("draft target", "target draft target"):
            client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
        llm = trtllm_double.llms[-1]
        generation_iterations = sum(1 for r in llm.requests for _ in range(r.responses - 1))
        deadline = time.monotonic() + 10
        while True:  # the reader polls the executor's statistics once a second
            text = httpx.get(f"{live.base_url}/metrics").text
            families = {f.name: f for f in text_string_to_metric_families(text)}
            counts = [
                s.value
                for s in families["specdeploy_target_pass_seconds"].samples
                if s.name.endswith("_count")
            ]
            if sum(counts) >= generation_iterations or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    assert sum(counts) == generation_iterations > 0
    draft = families["specdeploy_draft_pass_seconds"].samples
    assert sum(s.value for s in draft if s.name.endswith("_count")) == 4 * generation_iterations
    steps = families["specdeploy_speculative_steps"].samples
    assert sum(s.value for s in steps if s.name.endswith("_total")) == generation_iterations
