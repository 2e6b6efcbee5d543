"""Random aborts at random moments, for every backend: no request fails because another one went away, and
every slot is freed.

Each trial runs a handful of requests through the serving layer (``OpenAIServing.start`` + what the HTTP
layer does with a ``Run``) over a fresh scheduler on the same executors. Some requests are innocent (they end
by ``max_tokens`` or a stop string); others are abandoned by their client at a random moment in their first
50 ms (the task awaiting a non-streamed answer is cancelled, as on a disconnect; a stream is closed after a
random number of events); in some trials the server drains (``engine.stop``) at a random moment. Innocent
requests must end normally (or with ``abort`` when the drain overtook them), never with an error; after each
trial the queue gauges are back to 0 and the backend holds no state for any request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.api.serving import OpenAIServing, Prepared, ServingSettings
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.backends.standin import StandInTarget, standin_engine
from specdeploy_server.backends.trtllm_llmapi import LlmApiEngine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.scheduler import SchedulerSettings, SpeculativeScheduler
from specdeploy_server.core.types import SamplingParams
from specdeploy_server.engine import Engine, EngineClient
from specdeploy_server.metrics import ServerMetrics
from specdeploy_testkit import sample_text

from tests.server.conftest import TinyModels, run_live
from tests.server.trtllm_double import DoubleState, trtllm_double, write_engine

__all__ = ["trtllm_double"]

MODEL = "stress"
PROMPTS = sample_text.prompts(8, seed=5)
STOPS = ["e", " t"]  # frequent in the tiny models' text, so stop strings end requests early


@dataclass
class Tally:
    trials: int = 0
    innocent: int = 0
    innocent_failed: list[str] = field(default_factory=list)
    leaks: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------- one request
async def _non_streamed(serving: OpenAIServing, prepared: Prepared) -> str | None:
    finish = None
    async for _, delta in serving.start(prepared).deltas():
        finish = delta.finish_reason or finish
    return finish


async def _streamed(serving: OpenAIServing, prepared: Prepared, events: int | None) -> str | None:
    """Read the SSE stream (an in-band error raises); stop reading after ``events`` events if given."""
    finish = None
    stream = cast(AsyncGenerator[str, None], serving.stream_completion(serving.start(prepared)))
    try:
        count = 0
        async for event in stream:
            if event.startswith("data: {"):
                payload = json.loads(event[len("data: ") :])
                if "error" in payload:
                    raise RuntimeError(payload["error"]["message"])
                for choice in payload["choices"]:
                    finish = choice["finish_reason"] or finish
            count += 1
            if events is not None and count >= events:
                return None
    finally:
        await stream.aclose()
    return finish


async def _trial(
    engine: EngineClient, prompts: list[list[int]], rng: random.Random, tally: Tally, n: int = 4
) -> None:
    metrics = ServerMetrics(MODEL)
    metrics.bind_load(
        lambda: float(engine.queue_depth), lambda: engine.queue_seconds, lambda: engine.generation_rate
    )
    serving = OpenAIServing(engine, ServingSettings(MODEL), metrics)
    await engine.start()
    innocent: list[asyncio.Task[str | None]] = []
    abandoned: list[tuple[asyncio.Task[str | None], float]] = []
    for _ in range(n):
        kind = rng.choice(["length", "stop", "disconnect", "close-stream"])
        greedy = rng.random() < 0.7
        params = SamplingParams(temperature=0.0 if greedy else 1.0, seed=rng.randrange(1 << 30))
        max_tokens = rng.randint(1, 16) if kind in ("length", "stop") else 200
        stops = STOPS if kind == "stop" else []
        prepared = Prepared(rng.choice(prompts), max_tokens, params, stops, False)
        stream = rng.random() < 0.5
        # The run starts inside the consumer task, as in the HTTP layer (a task cancelled before it ran
        # never started a request); a stream that never starts is tested over ASGI (test_http_api).
        if kind == "close-stream":
            task = asyncio.ensure_future(_streamed(serving, prepared, rng.randint(1, 4)))
        elif stream:
            task = asyncio.ensure_future(_streamed(serving, prepared, None))
        else:
            task = asyncio.ensure_future(_non_streamed(serving, prepared))
        if kind == "disconnect":
            abandoned.append((task, rng.uniform(0.0, 0.05)))
        elif kind != "close-stream":
            innocent.append(task)
        else:
            abandoned.append((task, 10.0))  # ends by itself after a few events

    async def disconnect(task: asyncio.Task[str | None], after: float) -> None:
        await asyncio.sleep(after)
        task.cancel()

    killers = [asyncio.ensure_future(disconnect(t, after)) for t, after in abandoned if after < 10.0]
    drain = rng.random() < 0.25
    if drain:
        await asyncio.sleep(rng.uniform(0.0, 0.05))
        await engine.stop(rng.uniform(0.0, 0.03))
    results = await asyncio.gather(*innocent, return_exceptions=True)
    await asyncio.gather(*killers)
    await asyncio.gather(*(t for t, _ in abandoned), return_exceptions=True)
    if not drain:
        await engine.stop(30)
    tally.trials += 1
    for result in results:
        tally.innocent += 1
        allowed = {"length", "stop", "abort"} if drain else {"length", "stop"}
        if isinstance(result, BaseException) or result not in allowed:
            tally.innocent_failed.append(repr(result))
    depth = metrics.registry.get_sample_value("specdeploy_queue_depth", {"model": MODEL})
    in_flight = metrics.registry.get_sample_value("specdeploy_requests_in_flight", {"model": MODEL})
    if depth != 0 or in_flight != 0:
        tally.leaks.append(f"queue depth {depth}, in flight {in_flight} after the trial")


async def _run_trials(
    fresh: Callable[[], EngineClient],
    prompts: list[list[int]],
    trials: int,
    settled: Callable[[EngineClient], Awaitable[str | None]],
) -> Tally:
    tally = Tally()
    for i in range(trials):
        rng = random.Random(1000 + i)
        engine = fresh()
        await _trial(engine, prompts, rng, tally)
        problem = await settled(engine)
        if problem is not None:
            tally.leaks.append(f"trial {i}: {problem}")
    return tally


def _check(tally: Tally) -> None:
    assert tally.innocent > 0
    assert not tally.innocent_failed, (
        f"{len(tally.innocent_failed)} of {tally.innocent} innocent requests failed in {tally.trials} "
        f"trials: {tally.innocent_failed[:5]}"
    )
    assert not tally.leaks, f"{len(tally.leaks)} leaks: {tally.leaks[:5]}"


def _rescheduled(engine: Engine, settings: SchedulerSettings | None = None) -> Callable[[], EngineClient]:
    """A fresh scheduler over the same executors and tokenizer for every trial (a drain is terminal)."""
    sched = engine.scheduler

    def fresh() -> EngineClient:
        scheduler = SpeculativeScheduler(sched.target, sched.drafter, settings or sched.settings)
        return Engine(engine.tokenizer, scheduler, engine.info)

    return fresh


# ------------------------------------------------------------------------------------- the backends
@pytest.fixture(scope="module")
def encoded(tiny_models: TinyModels) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(str(tiny_models.target), local_files_only=True)
    return [list(tok.encode(p)) for p in PROMPTS]


@pytest.mark.parametrize("method", ["draftTarget", "promptLookup"])
def test_reference_backend(tiny_models: TinyModels, encoded: list[list[int]], method: str) -> None:
    config: dict[str, Any] = {
        "model": {"target": str(tiny_models.target)},
        "speculative": {"method": method, "draftLen": 8, "maxDraftLen": 8},
        "placement": {"device": "cpu"},
    }
    if method == "draftTarget":
        config["model"]["draft"] = str(tiny_models.draft_unrelated)
    engine = build_engine(ServerConfig.model_validate(config))
    assert isinstance(engine, Engine)
    target: Any = engine.scheduler.target
    drafter: Any = engine.scheduler.drafter
    models = [target.model] + ([drafter.executor.model] if method == "draftTarget" else [])

    async def settled(_: EngineClient) -> str | None:
        await asyncio.get_running_loop().run_in_executor(target._worker, lambda: None)  # queued releases
        held = [rid for m in models for rid in m._kv]
        held += list(getattr(drafter, "_indexes", {}))
        return f"KV caches left for {held}" if held else None

    tally = asyncio.run(
        _run_trials(_rescheduled(engine), encoded, 60 if method == "draftTarget" else 30, settled)
    )
    asyncio.run(engine.stop(1))
    _check(tally)


def test_trtllm_engine_double(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState, encoded: list[list[int]]
) -> None:
    config = {
        "backend": "trtllm-engine",
        "model": {
            "target": str(write_engine(tmp_path / "target", tiny_models.target, trtllm_double)),
            "draft": str(
                write_engine(
                    tmp_path / "draft",
                    tiny_models.draft_unrelated,
                    trtllm_double,
                    speculative_decoding_mode=1,
                )
            ),
        },
        "speculative": {"draftLen": 4},
    }
    engine = build_engine(ServerConfig.model_validate(config))
    assert isinstance(engine, Engine)
    clients = [engine.scheduler.target.client, engine.scheduler.drafter.executor.client]  # type: ignore[attr-defined]

    async def settled(_: EngineClient) -> str | None:
        held = [(c.name, dict(c._pending), dict(c._by_seq)) for c in clients if c._pending or c._by_seq]
        return f"executor requests left: {held}" if held else None

    tally = asyncio.run(_run_trials(_rescheduled(engine), encoded, 24, settled))
    asyncio.run(engine.stop(1))
    _check(tally)


def test_trtllm_llmapi_double(
    tiny_models: TinyModels, trtllm_double: DoubleState, encoded: list[list[int]]
) -> None:
    config = {
        "model": {"target": str(tiny_models.target)},
        "backend": "trtllm-llmapi",
        "speculative": {"method": "none"},
        "runtime": {"maxBatchSize": 8, "maxQueueSize": 64},
    }

    def fresh() -> EngineClient:  # a drain shuts the LLM down: a new one per trial
        engine = build_engine(ServerConfig.model_validate(config))
        assert isinstance(engine, LlmApiEngine)
        return engine

    async def settled(engine: EngineClient) -> str | None:
        assert isinstance(engine, LlmApiEngine)
        held = {**engine._remaining, **engine._outputs}
        return f"requests left: {held}" if held else None

    tally = asyncio.run(_run_trials(fresh, encoded, 24, settled))
    _check(tally)


@pytest.mark.parametrize("draft", [True, False], ids=["draft-model", "no-drafter"])
def test_standins(draft: bool) -> None:
    settings = SchedulerSettings(max_batch_size=3, draft_len=3)
    engine, _ = standin_engine(0.002, 0.0005 if draft else None, alpha=0.6, settings=settings)
    target = engine.scheduler.target
    assert isinstance(target, StandInTarget)

    async def settled(_: EngineClient) -> str | None:
        seen: set[str] = set().union(*target.seen) if target.seen else set()
        left = seen - target.released
        return f"never released: {sorted(left)}" if left else None

    prompts = [[97 + i, 98 + i] for i in range(6)]
    tally = asyncio.run(_run_trials(_rescheduled(engine, settings), prompts, 60, settled))
    _check(tally)


# ------------------------------------------------------------------------------------- over real HTTP
def test_real_disconnects_over_http() -> None:
    """The same over uvicorn and real connections: clients that hang up (a read timeout on a non-streamed
    request, a stream closed after a few events) at random moments, next to innocent requests."""
    settings = SchedulerSettings(max_batch_size=4, draft_len=3)
    engine, target = standin_engine(0.002, 0.0005, alpha=0.6, settings=settings)
    app = create_app(engine, served_model_name=MODEL)
    rng = random.Random(7)

    async def one(client: httpx.AsyncClient, i: int) -> str | None:
        kind = rng.choice(["length", "stop", "hang-up", "close-stream"])
        stream = kind == "close-stream" or rng.random() < 0.5
        body: dict[str, Any] = {"model": MODEL, "prompt": f"p{i}", "temperature": 0, "stream": stream}
        body["max_tokens"] = rng.randint(1, 16) if kind in ("length", "stop") else 4000  # seconds of work
        if kind == "stop":
            body["stop"] = ["e", "t"]
        if kind == "hang-up":  # the client gives up at a random moment: its connection is closed

            async def read_all() -> None:
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    async for _ in response.aiter_lines():
                        pass

            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(read_all(), rng.uniform(0.001, 0.05))
            return None
        if stream:
            finish = None
            async with client.stream("POST", "/v1/completions", json=body) as response:
                events = 0
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    payload = json.loads(line[len("data: ") :])
                    if "error" in payload:
                        return f"error event: {payload['error']['message']}"
                    finish = payload["choices"][0]["finish_reason"] if payload["choices"] else finish
                    events += 1
                    if kind == "close-stream" and events >= rng.randint(1, 4):
                        return None
            return None if finish in ("length", "stop") else f"stream ended with {finish}"
        response = await client.post("/v1/completions", json=body)
        if response.status_code != 200:
            return f"HTTP {response.status_code}: {response.text}"
        finish = response.json()["choices"][0]["finish_reason"]
        return None if finish in ("length", "stop") else f"finished with {finish}"

    async def main(base_url: str) -> list[str | None]:
        async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
            problems: list[str | None] = []
            for wave in range(10):
                problems += await asyncio.gather(*(one(client, 10 * wave + i) for i in range(10)))
            return problems

    with run_live(app) as live:
        problems = asyncio.run(main(live.base_url))
        deadline = time.monotonic() + 3  # less than the abandoned requests' own length (about 6 s each)
        while time.monotonic() < deadline and engine.queue_depth:
            time.sleep(0.02)
        metrics = httpx.get(f"{live.base_url}/metrics").text
    assert [p for p in problems if p is not None] == []
    assert f'specdeploy_queue_depth{{model="{MODEL}"}} 0.0' in metrics
    assert f'specdeploy_requests_in_flight{{model="{MODEL}"}} 0.0' in metrics
    seen: set[str] = set().union(*target.seen)
    assert seen - target.released == set()
