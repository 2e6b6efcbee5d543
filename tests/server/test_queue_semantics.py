"""``runtime.maxQueueSize`` means what it means in TensorRT-LLM's executor and llgtrt: 0 (or unset) is no
limit, a positive N a bound of N waiting requests beyond the running batch.

The configuration is the one the operator renders from examples/02 (whose runtime says ``maxQueueSize: 0``,
as seed 000's runtime.json), moved onto the tiny models of conftest.py: reference backend, CPU,
``maxBatchSize: 2``.
A burst of 8 concurrent completions is held at the scheduler's first step until each of the 8 has been queued
or refused, so the queue certainly forms whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.builders import OperatorSettings, build_engine_builds, build_server_config
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.executors import TargetExecutor, VerifyRequest
from specdeploy_server.core.scheduler import SchedulerSettings
from specdeploy_server.core.types import SequenceState
from specdeploy_server.engine import Engine

from tests.server.conftest import TinyModels
from tests.server.livethread import serve_on_loop

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "02-draft-target-llama8b-1b-h100.yaml"
MODEL = "tiny"
BURST = 8
BATCH = 2


def rendered_example_02(runtime: dict[str, Any] | None = None) -> dict[str, Any]:
    """The server configuration the operator renders for examples/02, its `spec.runtime` updated with
    ``runtime``."""
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["spec"]["runtime"].update(runtime or {})
    sdep = parse_object(doc)
    assert isinstance(sdep, SpeculativeDeployment)
    settings = OperatorSettings()
    return build_server_config(sdep, build_engine_builds(sdep, settings), settings)


def on_tiny_models(rendered: dict[str, Any], tiny_models: TinyModels) -> ServerConfig:
    """The rendered configuration with the models, backend and placement of a CPU test: every speculative and
    runtime setting is the operator's, except ``maxBatchSize`` (2, so that 8 requests must queue)."""
    config = {
        **rendered,
        "model": {
            "target": str(tiny_models.target),
            "draft": str(tiny_models.draft_same),
            "tokenizer": str(tiny_models.tokenizer),
            "servedModelName": MODEL,
        },
        "backend": "pytorch-reference",
        "placement": {"device": "cpu"},
        "runtime": {**rendered["runtime"], "maxBatchSize": BATCH},
    }
    return ServerConfig.model_validate(config)


class GatedTarget:
    """Holds every verify call until ``gate`` is set."""

    def __init__(self, inner: TargetExecutor, gate: asyncio.Event) -> None:
        self.inner = inner
        self.gate = gate

    @property
    def max_draft_len(self) -> int:
        return self.inner.max_draft_len

    async def verify(self, batch: Sequence[VerifyRequest]) -> list[list[int]]:
        await self.gate.wait()
        return await self.inner.verify(batch)

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)


def burst(config: ServerConfig) -> tuple[list[httpx.Response], int]:
    """Send BURST concurrent completions; the scheduler steps only once every one has been queued or
    refused (by the scheduler or, at its headers, by the admission gate). Returns the responses and the
    longest waiting queue seen."""
    engine = build_engine(config)
    assert isinstance(engine, Engine)
    scheduler = engine.scheduler
    assert scheduler.settings.max_batch_size == BATCH
    longest = 0

    async def main() -> list[httpx.Response]:
        nonlocal longest
        gate = asyncio.Event()
        scheduler.target = GatedTarget(scheduler.target, gate)
        settled = 0  # requests queued, or answered 503
        add = scheduler.add

        def one_more() -> None:
            nonlocal settled
            settled += 1
            if settled == BURST:
                gate.set()

        def counting_add(seq: SequenceState) -> None:
            nonlocal longest
            try:
                add(seq)
            finally:
                longest = max(longest, len(scheduler.waiting))
            one_more()  # queued (a refused one is counted by its 503)

        scheduler.add = counting_add  # type: ignore[method-assign]
        app = create_app(engine, served_model_name=MODEL)
        async with serve_on_loop(app) as base, httpx.AsyncClient(base_url=base, timeout=120) as http:
            body = {"model": MODEL, "prompt": "speculative decoding", "max_tokens": 12, "temperature": 0}

            async def post() -> httpx.Response:
                response = await http.post("/v1/completions", json=body)
                if response.status_code == 503:
                    one_more()
                return response

            return list(await asyncio.gather(*(post() for _ in range(BURST))))

    responses = asyncio.run(main())
    return responses, longest


def test_the_operator_renders_maxqueuesize_0_for_examples_02_and_for_unset() -> None:
    assert rendered_example_02()["runtime"]["maxQueueSize"] == 0
    doc = yaml.safe_load(EXAMPLE.read_text())
    del doc["spec"]["runtime"]["maxQueueSize"]
    sdep = parse_object(doc)
    assert isinstance(sdep, SpeculativeDeployment)
    rendered = build_server_config(sdep, build_engine_builds(sdep, OperatorSettings()))
    assert rendered["runtime"]["maxQueueSize"] == 0


@pytest.mark.parametrize("value", [0, None])
def test_zero_or_null_is_no_limit_in_the_server(value: int | None) -> None:
    config = ServerConfig.model_validate({"model": {"target": "/m"}, "runtime": {"maxQueueSize": value}})
    assert not config.runtime.max_queue_size
    assert ServerConfig.model_validate({"model": {"target": "/m"}}).runtime.max_queue_size == 0
    assert SchedulerSettings().max_queue_size is None


def test_a_burst_on_examples_02s_config_waits_and_nothing_is_refused(tiny_models: TinyModels) -> None:
    """maxQueueSize 0 (examples/02, seed 000): 8 concurrent requests on 2 batch slots all get 200; 6 wait."""
    config = on_tiny_models(rendered_example_02(), tiny_models)
    assert config.runtime.max_queue_size == 0
    responses, longest = burst(config)
    assert [r.status_code for r in responses] == [200] * BURST
    assert all(r.json()["usage"]["completion_tokens"] > 0 for r in responses)
    assert longest >= BURST - BATCH


def test_a_positive_maxqueuesize_bounds_the_queue_with_503(tiny_models: TinyModels) -> None:
    """maxQueueSize 2: the 2 batch slots and 2 queue places take 4 requests; the other 4 get 503 queue_full
    with Retry-After, and the admitted ones complete."""
    config = on_tiny_models(rendered_example_02({"maxQueueSize": 2}), tiny_models)
    assert config.runtime.max_queue_size == 2
    responses, _ = burst(config)
    codes = sorted(r.status_code for r in responses)
    assert codes == [200] * 4 + [503] * 4
    for refused in (r for r in responses if r.status_code == 503):
        assert refused.json()["error"]["code"] == "queue_full"
        assert refused.headers["retry-after"] == "1"
