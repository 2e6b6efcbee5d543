"""The autoscaling signals and safe scale-down, on the reference backend with the tiny models.

* ``specdeploy_queue_depth`` and ``specdeploy_queue_seconds`` under concurrent load from the openai package:
  above 0 while work is queued, equal to the scheduler's own figures, back to 0 when the load has drained;
* queueSeconds = pending tokens / measured rate, checked exactly on the scheduler with a fake clock;
* the rate counts *emitted* tokens per busy second, so a draft that is always accepted gives 5x the rate
  (and a fifth of the queueSeconds) of one that is always rejected, for the same pending tokens;
* SIGTERM: readiness and new requests are refused at once, in-flight requests finish, a request still running
  at ``shutdownTimeoutSeconds`` ends with ``finish_reason: abort``, and the process exits 0.

The SIGTERM test runs the real server process. Starting it (importing torch and transformers) takes seconds,
so a module fixture starts it with the first test of this module and the in-process tests run meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from specdeploy_server.api.app import app_state, create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.cli import HTTP_BACKSTOP_SECONDS
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.drafters import Drafter
from specdeploy_server.core.executors import TargetExecutor, VerifyRequest
from specdeploy_server.core.load import ThroughputMeter
from specdeploy_server.core.scheduler import GlobalStats, SpeculativeScheduler
from specdeploy_server.core.types import Proposal, SamplingParams, SequenceState
from specdeploy_server.engine import Engine
from specdeploy_testkit import checkpoints
from specdeploy_testkit.checkpoints import TinyLlama

from tests.server.conftest import TinyModels

MODEL = "tiny"
GREEDY = SamplingParams(temperature=0.0)
PROMPT = "speculative decoding draft target model"
SHUTDOWN_TIMEOUT = 3.0  # the server process's serving.shutdownTimeoutSeconds


# ----------------------------------------------------------------------------------------------- helpers
class FakeClock:
    """The scheduler's clock in the exact tests: time passes only when the target executor says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SteppedTarget:
    """A target executor wrapper. Each verify call costs ``step_seconds`` on ``clock`` (when given), and the
    test can hold the scheduler at the start of a verify call: ``allow(n)`` lets ``n`` more calls through
    (None: all), and ``holding`` is set while a call waits. A held step has its batch planned and drafted but
    nothing emitted, so the scheduler's figures stand still while the test reads them."""

    def __init__(self, inner: TargetExecutor, clock: FakeClock | None = None, step_seconds: float = 1.0):
        self.inner = inner
        self.clock = clock
        self.step_seconds = step_seconds
        self.budget: int | None = None
        self.holding = asyncio.Event()
        self._resume = asyncio.Event()

    @property
    def max_draft_len(self) -> int:
        return self.inner.max_draft_len

    def allow(self, steps: int | None) -> None:
        self.budget = steps
        self.holding.clear()
        self._resume.set()

    async def verify(self, batch: Sequence[VerifyRequest]) -> list[list[int]]:
        while self.budget == 0:
            self._resume.clear()
            self.holding.set()
            await self._resume.wait()
        if self.budget is not None:
            self.budget -= 1
        emitted = await self.inner.verify(batch)
        if self.clock is not None:
            self.clock.now += self.step_seconds
        return emitted

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)


class WrongDrafter:
    """The identical draft model's proposals with every token shifted by one: never the target's greedy
    choice, so each proposal is rejected at its first token, at the drafting cost of the accepted ones."""

    name = "wrong"
    has_cost = True

    def __init__(self, inner: Drafter, vocab_size: int) -> None:
        self.inner = inner
        self.vocab_size = vocab_size

    async def propose(self, batch: Sequence[tuple[SequenceState, int]], want_probs: bool) -> list[Proposal]:
        proposals = await self.inner.propose(batch, want_probs)
        return [Proposal([(t + 1) % self.vocab_size for t in p.tokens]) for p in proposals]

    def observe(self, seq: SequenceState, proposal: Proposal, num_accepted: int) -> None:
        self.inner.observe(seq, proposal, num_accepted)

    def release(self, request_id: str) -> None:
        self.inner.release(request_id)


def _engine(target: Path, draft: Path | None, max_batch_size: int = 64, method: str | None = None) -> Engine:
    spec: dict[str, Any] = {"draftLen": 4}
    if method is not None:
        spec["method"] = method
    config = ServerConfig.model_validate(
        {
            "model": {
                "target": str(target),
                "draft": str(draft) if draft else None,
                "servedModelName": MODEL,
            },
            "placement": {"device": "cpu"},
            "speculative": spec,
            "runtime": {"maxBatchSize": max_batch_size},
        }
    )
    engine = build_engine(config)
    assert isinstance(engine, Engine)
    return engine


def _stepped(
    engine: Engine, clock: FakeClock | None = None, step_seconds: float = 1.0, drafter: Drafter | None = None
) -> SteppedTarget:
    """Put a SteppedTarget (and optionally another drafter) under a fresh scheduler on ``clock``."""
    old = engine.scheduler
    target = SteppedTarget(old.target, clock, step_seconds)
    engine.scheduler = SpeculativeScheduler(
        target, drafter or old.drafter, old.settings, clock=clock or time.perf_counter
    )
    return target


async def _generate(engine: Engine, prompt: str, max_tokens: int) -> list[int]:
    gen = engine.generate(engine.tokenizer.encode(prompt), max_tokens, GREEDY)
    return [t async for out in gen.outputs for t in out.token_ids]


@dataclass
class Load:
    depth: float
    seconds: float
    rate: float
    in_flight: float


def _load(metrics_text: str) -> Load:
    """The load gauges of a /metrics page, parsed with prometheus_client's own parser."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.labels.get("model") == MODEL:
                values[sample.name] = sample.value
    return Load(
        values["specdeploy_queue_depth"],
        values["specdeploy_queue_seconds"],
        values["specdeploy_generation_tokens_per_second"],
        values["specdeploy_requests_in_flight"],
    )


@contextlib.asynccontextmanager
async def _serving(app: Any) -> AsyncIterator[str]:
    """Serve ``app`` with uvicorn on this event loop. The socket listens before the server starts, so clients
    can connect at once (they wait in the backlog until the application has started)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await task
        sock.close()


# ------------------------------------------------------------------------------- the server process
@dataclass
class ServerProcess:
    """``python -m specdeploy_server --config …`` with its stderr read line by line on a thread."""

    process: subprocess.Popen[str]
    lines: list[tuple[float, str]] = field(default_factory=list)
    port: int | None = None
    started: threading.Event = field(default_factory=threading.Event)
    shut_down: threading.Event = field(default_factory=threading.Event)  # "Application shutdown complete"
    shut_down_at: float = 0.0

    def read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            now = time.monotonic()
            self.lines.append((now, line))
            running = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            if running:
                self.port = int(running.group(1))
                self.started.set()
            if "Application shutdown complete" in line:
                self.shut_down_at = now
                self.shut_down.set()
        self.started.set()  # the process ended (port stays None if it never served)

    def log(self) -> str:
        return "".join(line for _, line in self.lines)


@pytest.fixture(scope="module")
def long_model(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target with a 32k context: room for a request that outlasts the shutdown timeout."""
    return checkpoints.save_tiny_llama(
        tmp_path_factory.mktemp("long") / "long",
        tiny_models.tokenizer,
        seed=0,
        shape=TinyLlama(max_position_embeddings=32768),
    )


@pytest.fixture(scope="module", autouse=True)
def server_process(long_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = tmp_path_factory.mktemp("server") / "server.json"
    config.write_text(
        json.dumps(
            {
                "model": {"target": str(long_model), "servedModelName": MODEL},
                "speculative": {"method": "none"},
                "placement": {"device": "cpu", "cpuThreads": 1},
                "serving": {"host": "127.0.0.1", "port": 0, "shutdownTimeoutSeconds": SHUTDOWN_TIMEOUT},
            }
        )
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "specdeploy_server", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    handle = ServerProcess(process)
    reader = threading.Thread(target=handle.read, name="server-stderr", daemon=True)
    reader.start()
    try:
        yield handle
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        reader.join(timeout=10)


# --------------------------------------------------------------------- 1. the gauges under real load
def test_queue_gauges_rise_under_concurrent_load_and_return_to_zero(tiny_models: TinyModels) -> None:
    """12 concurrent completions on a replica that steps 4 at a time: /metrics shows the queue while it
    exists, equal to the scheduler's figures, and 0 once every response is back."""
    requests, max_tokens = 12, 60
    engine = _engine(tiny_models.target, tiny_models.draft_same, max_batch_size=4)
    target = _stepped(engine)
    scheduler = engine.scheduler
    arrived = asyncio.Event()
    add = scheduler.add

    def counting_add(seq: SequenceState) -> None:
        add(seq)
        if scheduler.queue_depth == requests:
            arrived.set()

    scheduler.add = counting_add  # type: ignore[method-assign]

    async def main() -> None:
        async with (
            _serving(create_app(engine, served_model_name=MODEL)) as base,
            httpx.AsyncClient(base_url=base, timeout=60) as http,
        ):
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

            async def scrape() -> Load:
                response = await http.get("/metrics")
                assert response.status_code == 200
                return _load(response.text)

            # a first request measures the generation rate; idle again, the queue is 0, the rate stays
            await client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=10, temperature=0)
            idle = await scrape()
            assert (idle.depth, idle.seconds) == (0.0, 0.0)
            assert idle.rate > 0

            # hold the scheduler at its next step, then send the load
            target.allow(0)

            async def one(i: int) -> tuple[str | None, int]:
                prompt = f"{i} {PROMPT}"
                if i % 2:  # half streamed, half not
                    stream = await client.completions.create(
                        model=MODEL,
                        prompt=prompt,
                        max_tokens=max_tokens,
                        temperature=0,
                        stream=True,
                        stream_options={"include_usage": True},
                    )
                    finish, used = None, 0
                    async for chunk in stream:
                        if chunk.choices and chunk.choices[0].finish_reason:
                            finish = chunk.choices[0].finish_reason
                        if chunk.usage is not None:
                            used = chunk.usage.completion_tokens
                    return finish, used
                result = await client.completions.create(
                    model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0
                )
                assert result.usage is not None
                return result.choices[0].finish_reason, result.usage.completion_tokens

            load = [asyncio.create_task(one(i)) for i in range(requests)]
            await asyncio.wait_for(arrived.wait(), 30)
            await asyncio.wait_for(target.holding.wait(), 30)

            # held: every request is in the scheduler, those that came first in the held step (at most 4), the
            # others waiting; nothing generated yet
            held = await scrape()
            assert 1 <= len(scheduler.running) <= 4
            assert len(scheduler.waiting) >= requests - 4
            assert held.depth == len(scheduler.waiting) + len(scheduler.running) == requests
            assert scheduler.pending_tokens == requests * max_tokens
            assert held.rate == scheduler.generation_rate
            assert held.seconds == pytest.approx(requests * max_tokens / held.rate, rel=1e-12)
            assert held.seconds > 0

            # released: sample /metrics while the load drains
            target.allow(None)
            samples: list[Load] = []
            while not all(task.done() for task in load):
                samples.append(await scrape())
                await asyncio.sleep(0.02)  # the sampling interval, not a synchronisation
            results = [task.result() for task in load]
            drained = await scrape()

        # random weights: a few prompts meet the end-of-sequence token early
        assert all((f, n) == ("length", max_tokens) or (f == "stop" and n <= max_tokens) for f, n in results)
        assert samples, "no sample taken while the load ran"
        depths = [s.depth for s in samples]
        assert depths == sorted(depths, reverse=True)  # no new arrivals: the queue only shrinks
        assert all(0 <= d <= requests for d in depths)
        assert all((s.seconds > 0) == (s.depth > 0) for s in samples)
        assert (drained.depth, drained.seconds, drained.in_flight) == (0.0, 0.0, 0.0)
        assert drained.rate > 0  # the last measured rate survives the idle replica

    asyncio.run(main())


# ----------------------------------------------------- 2. queueSeconds = pending tokens / measured rate
def test_queue_seconds_is_pending_tokens_over_the_measured_rate(tiny_models: TinyModels) -> None:
    async def main() -> None:
        clock = FakeClock()
        engine = _engine(tiny_models.target, tiny_models.draft_same, max_batch_size=2)
        target = _stepped(engine, clock, step_seconds=0.25)
        scheduler = engine.scheduler
        await engine.start()
        assert (scheduler.queue_depth, scheduler.queue_seconds, scheduler.generation_rate) == (0, 0.0, None)

        # Two requests stepped together; the identical draft is always accepted: 4 + 1 tokens per sequence
        # per step, 10 per step, 0.25 s per step: 40 tokens per busy second.
        outputs = await asyncio.gather(_generate(engine, PROMPT, 40), _generate(engine, "hello world", 40))
        assert [len(o) for o in outputs] == [40, 40]
        assert scheduler.stats.steps == 8
        assert scheduler.stats.accepted == scheduler.stats.drafted == 2 * 8 * 4
        assert scheduler.generation_rate == pytest.approx(80 / (8 * 0.25), rel=1e-12)
        assert (scheduler.queue_depth, scheduler.pending_tokens, scheduler.queue_seconds) == (0, 0, 0.0)

        clock.now += 3600.0  # an idle hour passes: idle time is not busy time, the rate stands
        assert scheduler.generation_rate == pytest.approx(40.0, rel=1e-12)

        # Four requests behind a held step: two running (max batch 2), two waiting.
        target.allow(0)
        gens = [engine.generate(engine.tokenizer.encode(PROMPT), n, GREEDY) for n in (30, 70, 5, 45)]
        cancelled = list(scheduler.waiting)[1]
        await asyncio.wait_for(target.holding.wait(), 30)
        assert [s.max_tokens for s in scheduler.running] == [30, 70]
        assert scheduler.queue_seconds == pytest.approx(150 / 40.0, rel=1e-12)

        # A request cancelled while running is no longer work, though it leaves `running` only at the next
        # admission: not in the depth, not in the pending tokens.
        scheduler.abort(cancelled)
        assert cancelled in scheduler.running
        assert scheduler.queue_depth == 3
        assert scheduler.pending_tokens == 30 + 5 + 45
        assert scheduler.queue_seconds == pytest.approx(80 / 40.0, rel=1e-12)

        # One step: the 30-token request gets 5 tokens; then the 5- and 45-token ones are admitted.
        rate_before = scheduler.generation_rate
        target.allow(1)
        await asyncio.wait_for(target.holding.wait(), 30)
        assert [s.max_tokens for s in scheduler.running] == [30, 5]
        assert scheduler.queue_depth == 3
        assert scheduler.pending_tokens == 25 + 5 + 45
        rate = scheduler.generation_rate
        assert rate is not None
        assert rate_before is not None
        # that step emitted 5 tokens in 0.25 s (20/s): the rate moved towards it, not onto it
        assert 20.0 < rate < rate_before
        assert scheduler.queue_seconds == pytest.approx(75 / rate, rel=1e-12)

        target.allow(None)
        done = [[t async for out in g.outputs for t in out.token_ids] for g in gens]
        assert [len(tokens) for tokens in done] == [30, 0, 5, 45]
        assert (scheduler.queue_depth, scheduler.pending_tokens, scheduler.queue_seconds) == (0, 0, 0.0)
        await engine.stop(1)

    asyncio.run(main())


def test_the_throughput_meter_is_tokens_per_busy_second() -> None:
    meter = ThroughputMeter(window_seconds=10.0)
    assert meter.rate is None
    meter.observe(0, 0.0)
    assert meter.rate is None
    # a ratio of sums: a long step of 10 tokens/s and a very short one of 1000 tokens/s weigh by duration
    meter.observe(10, 1.0)
    meter.observe(1, 0.001)
    assert meter.rate == pytest.approx(11 / 1.001, rel=1e-3)
    # after many window lengths of busy time at another rate, the old one is forgotten
    for _ in range(200):
        meter.observe(50, 1.0)
    assert meter.rate == pytest.approx(50.0, rel=1e-6)


# ------------------------------------------------- 3. the speculative speedup is in the measured rate
@dataclass
class RunFigures:
    stats: GlobalStats
    rate: float
    pending: int
    queue_seconds: float


def _measure(tiny_models: TinyModels, always_rejected: bool) -> RunFigures:
    """A 40-token greedy request at one (fake) second per step, then three 50-token requests held waiting."""

    async def main() -> RunFigures:
        clock = FakeClock()
        engine = _engine(tiny_models.target, tiny_models.draft_same, max_batch_size=4)
        drafter = engine.scheduler.drafter
        if always_rejected:
            drafter = WrongDrafter(drafter, engine.info.vocab_size or 0)
        target = _stepped(engine, clock, step_seconds=1.0, drafter=drafter)
        scheduler = engine.scheduler
        await engine.start()
        assert len(await _generate(engine, PROMPT, 40)) == 40
        stats, rate = replace(scheduler.stats), scheduler.generation_rate
        assert rate is not None
        target.allow(0)
        for _ in range(3):
            engine.generate(engine.tokenizer.encode(PROMPT), 50, GREEDY)
        await asyncio.wait_for(target.holding.wait(), 30)
        figures = RunFigures(stats, rate, scheduler.pending_tokens, scheduler.queue_seconds)
        await engine.stop(0)
        return figures

    return asyncio.run(main())


def test_the_rate_counts_emitted_tokens_so_accepted_drafts_lower_queue_seconds(
    tiny_models: TinyModels,
) -> None:
    accepted = _measure(tiny_models, always_rejected=False)
    rejected = _measure(tiny_models, always_rejected=True)

    # The accounting, step by step: every draft token accepted, 4 + 1 tokens per step ...
    assert accepted.stats.steps == accepted.stats.sequence_steps == 8
    assert accepted.stats.drafted == accepted.stats.accepted == 8 * 4
    assert accepted.stats.emitted == 40
    # ... or every one rejected (as many drafted per step, k clamped near max_tokens), 1 token per step.
    assert rejected.stats.steps == rejected.stats.sequence_steps == 40
    assert rejected.stats.drafted == 36 * 4 + 3 + 2 + 1
    assert rejected.stats.accepted == 0
    assert rejected.stats.emitted == 40

    # The rate is emitted tokens per busy second (one fake second per step): 1 + accepted per step. Counting
    # steps (1/s for both), draft tokens + 1 (5/s for both) or accepted tokens (0/s) would all fail here.
    assert accepted.rate == pytest.approx(accepted.stats.emitted / accepted.stats.steps, rel=1e-12)
    assert rejected.rate == pytest.approx(rejected.stats.emitted / rejected.stats.steps, rel=1e-12)
    assert accepted.rate == pytest.approx(5.0, rel=1e-12)
    assert rejected.rate == pytest.approx(1.0, rel=1e-12)

    # The same pending tokens are a fifth of the queue seconds on the replica whose drafts are accepted.
    assert accepted.pending == rejected.pending == 3 * 50
    assert accepted.queue_seconds == pytest.approx(150 / 5.0, rel=1e-12)
    assert rejected.queue_seconds == pytest.approx(150 / 1.0, rel=1e-12)


# ----------------------------------------------------------------------------------- 4. draining
def test_draining_refuses_new_work_finishes_in_flight_and_aborts_what_is_left(long_model: Path) -> None:
    """What SIGTERM does inside the server (AppState.begin_drain), in process: readiness 503 ``draining``,
    new requests 503 ``shutting_down`` with Retry-After, liveness still 200; the in-flight request that can
    finish does; the one that cannot ends at the shutdown timeout with ``finish_reason: abort`` and [DONE]."""
    timeout = 1.0
    engine = _engine(long_model, None, method="none")
    app = create_app(engine, served_model_name=MODEL, shutdown_timeout=timeout)
    state = app_state(app)

    async def main() -> None:
        async with (
            _serving(app) as base,
            httpx.AsyncClient(base_url=base, timeout=60) as http,
        ):
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
            long = await client.completions.create(
                model=MODEL, prompt=PROMPT, max_tokens=30000, temperature=0, stream=True
            )
            short = await client.completions.create(
                model=MODEL,
                prompt=PROMPT,
                max_tokens=40,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
            await anext(long)
            await anext(short)
            assert engine.queue_depth == 2  # both in flight

            started = time.monotonic()
            state.begin_drain()
            ready = await http.get("/health/ready")
            assert (ready.status_code, ready.json()) == (503, {"status": "draining"})
            assert (await http.get("/health/live")).status_code == 200
            refused = await http.post(
                "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 3}
            )
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "shutting_down"

            short_rest = [chunk async for chunk in short]  # ends at [DONE]
            long_rest = [chunk async for chunk in long]
            ended = time.monotonic() - started
            assert state.drain_task is not None
            await state.drain_task

        assert [c.choices[0].finish_reason for c in short_rest if c.choices][-1] == "length"
        assert short_rest[-1].usage is not None
        assert short_rest[-1].usage.completion_tokens == 40
        assert str(long_rest[-1].choices[0].finish_reason) == "abort"  # not in the openai types
        assert timeout <= ended < timeout + 2.0

    asyncio.run(main())


def test_sigterm_drains_the_server_process_and_exits_zero(server_process: ServerProcess) -> None:
    """The real process: SIGTERM with two streams in flight. The 40-token one completes; the 30000-token one
    is aborted at shutdownTimeoutSeconds; nothing new is accepted after the signal; exit status 0."""
    assert server_process.started.wait(timeout=180), "the server process did not start"
    assert server_process.port is not None, server_process.log()
    base = f"http://127.0.0.1:{server_process.port}"
    with httpx.Client(base_url=base, timeout=30) as http:
        assert http.get("/health/ready").status_code == 200

    async def main() -> tuple[float, float, list[Any], list[Any], list[int | str], list[int | str]]:
        client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
        long = await client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=30000, temperature=0, stream=True
        )
        await anext(long)
        short = await client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=40,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        await anext(short)
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            in_flight = _load((await http.get("/metrics")).text).depth
        server_process.process.send_signal(signal.SIGTERM)
        signalled = time.monotonic()

        # From the signal on, nothing is ready and nothing new is taken: 503 while the listener is still
        # open, connection refused once uvicorn has closed it.
        async def status(method: str, path: str, **kwargs: Any) -> int | str:
            try:
                async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                    response = await http.request(method, path, **kwargs)
            except httpx.ConnectError:
                return "refused"
            if response.status_code == 503 and path == "/health/ready":
                assert response.json() == {"status": "draining"}
            elif response.status_code == 503:
                assert response.headers.get("retry-after") == "1"
                assert response.json()["error"]["code"] == "shutting_down"
            return response.status_code

        readiness, new = [], []
        for _ in range(3):
            readiness.append(await status("GET", "/health/ready"))
            new.append(
                await status(
                    "POST", "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2}
                )
            )
        short_rest = [chunk async for chunk in short]
        long_rest = [chunk async for chunk in long]
        return in_flight, signalled, short_rest, long_rest, readiness, new

    in_flight, signalled, short_rest, long_rest, readiness, new = asyncio.run(main())
    returncode = server_process.process.wait(timeout=60)
    exited = time.monotonic() - signalled
    assert server_process.shut_down.wait(timeout=10)
    log = server_process.log()

    assert set(readiness) <= {503, "refused"}, readiness
    assert set(new) <= {503, "refused"}, new
    # both requests were in flight just before the signal (the short one still had 39 tokens, dozens of
    # steps, to go); the short one completed in full
    assert in_flight == 2
    finish = [c.choices[0].finish_reason for c in short_rest if c.choices]
    assert finish[-1] == "length"
    assert short_rest[-1].usage is not None
    assert short_rest[-1].usage.completion_tokens == 40
    # the long one was cut off at the shutdown timeout, still with a proper end of stream
    assert long_rest[-1].choices[0].finish_reason == "abort"
    assert returncode == 0, log
    assert "timeout graceful shutdown exceeded" not in log  # the engine ended the streams, not uvicorn
    # The server had shut down (lifespan complete) about shutdownTimeoutSeconds after the signal; the rest
    # until the exit is the interpreter releasing torch and transformers (seconds on a slow machine).
    shut_down = server_process.shut_down_at - signalled
    assert SHUTDOWN_TIMEOUT - 0.5 <= shut_down < SHUTDOWN_TIMEOUT + HTTP_BACKSTOP_SECONDS, log
    assert exited < 60
