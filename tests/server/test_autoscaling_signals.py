"""The autoscaling signals, on the reference backend with the tiny models.

* ``specdeploy_queue_depth`` and ``specdeploy_queue_seconds`` under concurrent load from the openai package:
  above 0 while work is queued, equal to the scheduler's own figures, back to 0 when the load has drained;
* queueSeconds = pending tokens / measured rate, checked exactly on the scheduler with a fake clock;
* the rate counts *emitted* tokens per busy second, so a draft that is always accepted gives 5x the rate
  (and a fifth of the queueSeconds) of one that is always rejected, for the same pending tokens.

Safe scale-down (draining on SIGTERM) is test_draining.py's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import httpx
import openai
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.core.drafters import Drafter
from specdeploy_server.core.executors import TargetExecutor, VerifyRequest
from specdeploy_server.core.load import ThroughputMeter
from specdeploy_server.core.scheduler import GlobalStats, SpeculativeScheduler
from specdeploy_server.core.types import Proposal, SamplingParams, SequenceState
from specdeploy_server.engine import Engine

from tests.server.conftest import TinyModels
from tests.server.cpu_engine import MODEL, PROMPT, Load, cpu_engine, load_gauges
from tests.server.livethread import serve_on_loop

GREEDY = SamplingParams(temperature=0.0)


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


# --------------------------------------------------------------------- 1. the gauges under real load
def test_queue_gauges_rise_under_concurrent_load_and_return_to_zero(tiny_models: TinyModels) -> None:
    """12 concurrent completions on a replica that steps 4 at a time: /metrics shows the queue while it
    exists, equal to the scheduler's figures, and 0 once every response is back."""
    requests, max_tokens = 12, 60
    engine = cpu_engine(tiny_models.target, tiny_models.draft_same, max_batch_size=4)
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
            serve_on_loop(create_app(engine, served_model_name=MODEL)) as base,
            httpx.AsyncClient(base_url=base, timeout=60) as http,
        ):
            client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)

            async def scrape() -> Load:
                response = await http.get("/metrics")
                assert response.status_code == 200
                return load_gauges(response.text)

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
        engine = cpu_engine(tiny_models.target, tiny_models.draft_same, max_batch_size=2)
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
        engine = cpu_engine(tiny_models.target, tiny_models.draft_same, max_batch_size=4)
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
