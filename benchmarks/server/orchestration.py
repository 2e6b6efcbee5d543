"""Benchmark 1: does the Python step loop cost anything next to a (simulated) GPU step?

Stand-in executors take a fixed time per batched call: a draft call ``k * d`` seconds, a verify call ``t``
seconds, whatever the batch size, and accept each draft token with probability alpha. Closed-loop clients keep
``concurrency`` requests in flight. Ideal tokens/s = concurrency * (tokens per sequence step) / (k*d + t),
using the tokens per step the run actually achieved; efficiency = measured / ideal.

Measured over a steady-state window of whole steps (see ``_run``): every client has a request in flight all
through it, and each client's resubmission after a request ends falls inside it. The stand-ins hold their
nominal latency to within a few microseconds (a timer plus a short spin, see ``backends.standin``), except
when the OS deschedules the process on a loaded machine. A second figure, busy / wall, is the fraction of
time the "GPU" had work (it counts any overshoot of the stand-ins as busy); one minus it is what the Python
loop costs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from specdeploy_server.backends.standin import StandInDraft, StandInTarget, standin_engine, wait_until
from specdeploy_server.core.drafters import DraftModelDrafter
from specdeploy_server.core.scheduler import SchedulerSettings, StepSpeculation
from specdeploy_server.core.types import SamplingParams


@dataclass(frozen=True)
class OrchestrationResult:
    label: str
    concurrency: int
    draft_ms: float
    verify_ms: float
    draft_len: int
    alpha: float
    tokens_per_step: float
    measured_tok_s: float
    ideal_tok_s: float
    busy_fraction: float

    @property
    def efficiency(self) -> float:
        return self.measured_tok_s / self.ideal_tok_s


async def _run(
    *,
    label: str,
    concurrency: int,
    draft_ms: float,
    verify_ms: float,
    k: int,
    alpha: float,
    seconds: float,
) -> OrchestrationResult:
    settings = SchedulerSettings(max_batch_size=max(concurrency, 1), max_queue_size=None, draft_len=k)
    engine, _ = standin_engine(verify_ms / 1000, draft_ms / 1000, alpha, settings)
    drafter = engine.scheduler.drafter
    draft_executor = drafter.executor if isinstance(drafter, DraftModelDrafter) else None
    target = engine.scheduler.target
    assert isinstance(target, StandInTarget)
    await engine.start()
    params = SamplingParams(temperature=0.0)

    def busy() -> float:
        extra = draft_executor.busy_seconds if isinstance(draft_executor, StandInDraft) else 0.0
        return target.busy_seconds + extra

    # The window: whole steps, from the end of the first step that ends after a 0.2 s ramp-up to the end of
    # the last step that finishes before the deadline. Every client has a request in flight all through it (a
    # client resubmits as soon as its request ends, and that gap is measured); the ramp-up and the drain
    # after the deadline, when fewer than `concurrency` requests are in flight, are outside it.
    marks: list[tuple[float, int, int, float]] = []  # (time, emitted, sequence steps, executor busy) per step
    stats = engine.stats
    measuring = False

    class _Marker:
        def on_step(self, batch_size: int, seconds: float, emitted: int) -> None:
            if measuring:
                marks.append((time.perf_counter(), stats.emitted, stats.sequence_steps, busy()))

        def on_speculation(self, step: StepSpeculation) -> None:
            return None

    engine.scheduler.observer = _Marker()
    warm = engine.generate([97], 8, params)
    async for _ in warm.outputs:
        pass

    stop = False

    async def client() -> None:
        while not stop:
            gen = engine.generate([97, 98, 99], 256, params)
            async for _ in gen.outputs:
                pass

    clients = [asyncio.ensure_future(client()) for _ in range(concurrency)]
    await asyncio.sleep(0.2)  # all clients submitted and running
    measuring = True
    await asyncio.sleep(seconds)
    measuring = False
    stop = True
    await engine.stop(0)  # abort what is in flight: the drain is not measured
    await asyncio.gather(*clients)
    (t0, emitted0, steps0, busy0), (t1, emitted1, steps1, busy1) = marks[0], marks[-1]
    elapsed = t1 - t0
    busy_fraction = (busy1 - busy0) / elapsed
    emitted = emitted1 - emitted0
    steps = steps1 - steps0
    per_step = emitted / steps
    step_seconds = (k * draft_ms + verify_ms) / 1000
    return OrchestrationResult(
        label,
        concurrency,
        draft_ms,
        verify_ms,
        k,
        alpha,
        per_step,
        emitted / elapsed,
        concurrency * per_step / step_seconds,
        busy_fraction,
    )


STANDIN_SLACK_SECONDS = 0.002
"""How late the best of twenty stand-in waits may return: more, and their nominal times (the ideal this
benchmark divides by) do not hold on this machine."""


async def standin_overshoot(seconds: float, calls: int = 20) -> list[float]:
    """How late each of `calls` stand-in waits of `seconds` returns (never early: a negative value raises)."""
    loop = asyncio.get_running_loop()
    late = []
    for _ in range(calls):
        started = loop.time()
        await wait_until(time.perf_counter() + seconds)
        late.append(loop.time() - started - seconds)
    if min(late) < -1e-6:
        raise RuntimeError(f"a stand-in wait of {seconds} s returned early: {min(late):.6f} s")
    return late


def check_standins() -> None:
    """The stand-ins keep their nominal times: the best of twenty waits is within `STANDIN_SLACK_SECONDS`
    (a loaded machine can deschedule any one spin)."""
    for seconds in (0.0005, 0.003, 0.012):
        best = min(asyncio.run(standin_overshoot(seconds)))
        if best >= STANDIN_SLACK_SECONDS:
            raise RuntimeError(f"stand-in waits of {seconds} s return {best * 1000:.2f} ms late at best")


def run(seconds: float = 4.0) -> list[OrchestrationResult]:
    check_standins()
    results = []
    for label, draft_ms, verify_ms, k, alpha in (
        ("draft model", 2.0, 25.0, 4, 0.7),
        ("free drafter (d=0, like prompt lookup)", 0.0, 25.0, 4, 0.4),
    ):
        for concurrency in (1, 8, 64):
            results.append(
                asyncio.run(
                    _run(
                        label=label,
                        concurrency=concurrency,
                        draft_ms=draft_ms,
                        verify_ms=verify_ms,
                        k=k,
                        alpha=alpha,
                        seconds=seconds,
                    )
                )
            )
    return results


def table(results: list[OrchestrationResult]) -> str:
    lines = [
        "| drafter | concurrency | d (ms/token) | t (ms) | k | alpha | tokens/step | measured tok/s "
        "| ideal tok/s (nominal) | efficiency (nominal) | executor busy / wall |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.label} | {r.concurrency} | {r.draft_ms:g} | {r.verify_ms:g} | {r.draft_len} | {r.alpha:g} "
            f"| {r.tokens_per_step:.2f} | {r.measured_tok_s:.0f} | {r.ideal_tok_s:.0f} | {r.efficiency:.3f} "
            f"| {r.busy_fraction:.3f} |"
        )
    return "\n".join(lines)
