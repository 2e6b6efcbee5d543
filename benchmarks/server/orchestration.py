"""Benchmark 1: does the Python step loop cost anything next to a (simulated) GPU step?

Stand-in executors take a fixed time per batched call: a draft call ``k * d`` seconds, a verify call ``t``
seconds, whatever the batch size, and accept each draft token with probability alpha. Closed-loop clients keep
``concurrency`` requests in flight. Ideal tokens/s = concurrency * (tokens per sequence step) / (k*d + t),
using
the tokens per step the run actually achieved; efficiency = measured / ideal.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from specdeploy_server.backends.standin import standin_engine
from specdeploy_server.core.scheduler import SchedulerSettings
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

    @property
    def efficiency(self) -> float:
        return self.measured_tok_s / self.ideal_tok_s


async def _run(
    *,
    label: str,
    concurrency: int,
    draft_ms: float | None,
    verify_ms: float,
    k: int,
    alpha: float,
    seconds: float,
) -> OrchestrationResult:
    settings = SchedulerSettings(max_batch_size=max(concurrency, 1), max_queue_size=None, draft_len=k)
    engine, _ = standin_engine(
        verify_ms / 1000, None if draft_ms is None else draft_ms / 1000, alpha, settings
    )
    await engine.start()
    stop_at = time.perf_counter() + seconds
    params = SamplingParams(temperature=0.0)

    async def client() -> None:
        while time.perf_counter() < stop_at:
            gen = engine.generate([97, 98, 99], 256, params)
            async for _ in gen.outputs:
                pass

    warm = engine.generate([97], 8, params)
    async for _ in warm.outputs:
        pass
    base = engine.stats.emitted, engine.stats.sequence_steps
    started = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    emitted = engine.stats.emitted - base[0]
    steps = engine.stats.sequence_steps - base[1]
    await engine.stop(1)
    per_step = emitted / steps
    step_seconds = (k * (draft_ms or 0.0) + verify_ms) / 1000
    return OrchestrationResult(
        label,
        concurrency,
        draft_ms or 0.0,
        verify_ms,
        k,
        alpha,
        per_step,
        emitted / elapsed,
        concurrency * per_step / step_seconds,
    )


def run(seconds: float = 4.0) -> list[OrchestrationResult]:
    results = []
    for label, draft_ms, verify_ms, k, alpha in (
        ("draft model", 2.0, 25.0, 4, 0.7),
        ("prompt lookup", None, 25.0, 4, 0.4),
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
        "| ideal tok/s | efficiency |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.label} | {r.concurrency} | {r.draft_ms:g} | {r.verify_ms:g} | {r.draft_len} | {r.alpha:g} "
            f"| {r.tokens_per_step:.2f} | {r.measured_tok_s:.0f} | {r.ideal_tok_s:.0f} | {r.efficiency:.3f} |"
        )
    return "\n".join(lines)
