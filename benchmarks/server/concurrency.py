"""Benchmark 4: the reference backend under concurrent requests.

Same CPU models as benchmark 2 (``assisted.build_models``), greedy, ``draftTarget``. The same requests run at
concurrency 1 (one after another) and at higher concurrency (up to ``concurrency`` requests in flight through
the engine's async ``generate`` API; when ``concurrency`` equals the number of requests, all are submitted at
once). The reference backend interleaves the running sequences step by step but runs each sequence's
forward on its own (one worker thread, no padded batching), so aggregate throughput is expected to stay near
the concurrency-1 figure while per-request latency grows with the number in flight; outputs must not change.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.types import SamplingParams
from specdeploy_testkit import sample_text

from benchmarks.server import assisted

METHOD = "draftTarget"


@dataclass(frozen=True)
class ConcurrencyResult:
    concurrency: int
    requests: int
    tokens: int
    seconds: float
    latency_p50: float
    latency_max: float
    mean_batch: float
    identical: bool

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


async def _measure(
    engine: Any, prompts: list[list[int]], max_new: int, concurrency: int
) -> tuple[float, list[float], list[list[int]], float]:
    gate = asyncio.Semaphore(concurrency)
    steps0, seq_steps0 = engine.stats.steps, engine.stats.sequence_steps

    async def one(ids: list[int]) -> tuple[float, list[int]]:
        async with gate:
            started = time.perf_counter()
            gen = engine.generate(ids, max_new, SamplingParams(temperature=0.0))
            new = [t async for o in gen.outputs for t in o.token_ids]
            return time.perf_counter() - started, new

    started = time.perf_counter()
    done = await asyncio.gather(*(one(ids) for ids in prompts))
    elapsed = time.perf_counter() - started
    steps = engine.stats.steps - steps0
    mean_batch = (engine.stats.sequence_steps - seq_steps0) / steps if steps else 0.0
    return elapsed, [d[0] for d in done], [d[1] for d in done], mean_batch


def run(
    requests: int = 8, max_new: int = 64, k: int = 4, levels: tuple[int, ...] = (1, 4, 8)
) -> list[ConcurrencyResult]:
    levels = tuple(c for c in levels if c <= requests) or (1,)
    torch.set_num_threads(1)
    texts = sample_text.prompts(requests, seed=11)
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = assisted.build_models(Path(tmp))
        config = {
            "model": {"target": str(target), "draft": str(draft)},
            "speculative": {"method": METHOD, "draftLen": k},
            "placement": {"device": "cpu"},
        }

        async def main() -> list[ConcurrencyResult]:
            engine = build_engine(ServerConfig.model_validate(config))
            await engine.start()
            try:
                prompts = [engine.tokenizer.encode(t) for t in texts]
                await _measure(engine, prompts[:1], 8, 1)  # warm-up (first-call allocations)
                results: list[ConcurrencyResult] = []
                reference: list[list[int]] | None = None
                for level in levels:
                    elapsed, latencies, outputs, mean_batch = await _measure(engine, prompts, max_new, level)
                    if reference is None:
                        reference = outputs
                    identical = outputs == reference
                    assert identical, f"concurrency {level}: outputs differ from concurrency {levels[0]}"
                    results.append(
                        ConcurrencyResult(
                            concurrency=level,
                            requests=len(prompts),
                            tokens=sum(len(o) for o in outputs),
                            seconds=elapsed,
                            latency_p50=statistics.median(latencies),
                            latency_max=max(latencies),
                            mean_batch=mean_batch,
                            identical=identical,
                        )
                    )
                return results
            finally:
                await engine.stop(5)

        return asyncio.run(main())


def table(results: list[ConcurrencyResult]) -> str:
    lines = [
        "| concurrency | requests | tokens | wall (s) | aggregate tok/s | vs concurrency 1 | mean batch "
        "| latency p50 (s) | latency max (s) | output = concurrency 1 |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    base = results[0].tok_s
    for r in results:
        lines.append(
            f"| {r.concurrency} | {r.requests} | {r.tokens} | {r.seconds:.2f} | {r.tok_s:.1f} "
            f"| {r.tok_s / base:.2f} | {r.mean_batch:.2f} | {r.latency_p50:.2f} | {r.latency_max:.2f} "
            f"| {'yes' if r.identical else 'NO'} |"
        )
    return "\n".join(lines)
