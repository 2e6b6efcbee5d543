"""Mixed load for a while: streamed and plain completions, chat, and clients that cancel mid-request. The
server's resident memory and open file descriptors are sampled throughout; after a warm-up they must not grow
(RSS by less than 5 %, descriptors not at all beyond the connections open at the moment), and the latency
percentiles of the last third must stay close to those of the first third after the warm-up."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from dataclasses import dataclass, field

import httpx

from benchmarks.reliability.hostile import Outcome, completion_body, path_for, settled
from benchmarks.reliability.probes import open_fds, percentile, rss_bytes

RSS_GROWTH_LIMIT = 0.05
#: the last third's p50 may be this much slower than the first third's (a loaded, shared machine drifts)
LATENCY_DRIFT_LIMIT = 1.5


@dataclass
class _Samples:
    times: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    fds: list[int] = field(default_factory=list)
    latencies: list[tuple[float, float]] = field(default_factory=list)  # (when, seconds)
    kinds: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


async def _worker(base_url: str, model: str, seed: int, until: float, samples: _Samples) -> None:
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        i = 0
        while time.monotonic() < until:
            i += 1
            kind = rng.choice(["stream", "plain", "chat", "chat-stream", "cancel"])
            samples.kinds[kind] = samples.kinds.get(kind, 0) + 1
            streamed = "stream" in kind or kind == "cancel"
            body = completion_body(model, seed * 100000 + i, streamed, 16, "chat" in kind)
            started = time.monotonic()
            if kind == "cancel":  # gone after a few events
                async with client.stream("POST", path_for(body), json=body) as response:
                    seen = 0
                    async for _ in response.aiter_lines():
                        seen += 1
                        if seen > rng.randint(1, 6):
                            break
                continue
            response = await client.post(path_for(body), json=body)
            if response.status_code != 200 or b'"error"' in response.content:
                samples.errors.append(f"{kind}: {response.status_code} {response.content[:100]!r}")
            samples.latencies.append((started, time.monotonic() - started))


async def _sampler(pid: int, interval: float, until: float, samples: _Samples) -> None:
    while time.monotonic() < until:
        samples.times.append(time.monotonic())
        samples.rss.append(rss_bytes(pid))
        samples.fds.append(open_fds(pid))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.sleep(interval)


async def _fds_at_rest(pid: int, target: int, grace: float = 5.0) -> int:
    """Open descriptors once the server has seen the clients' connections close (within ``grace``)."""
    deadline = time.monotonic() + grace
    while (count := open_fds(pid)) > target and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    return count


def _window(latencies: list[tuple[float, float]], start: float, end: float) -> list[float]:
    return [seconds for when, seconds in latencies if start <= when < end]


async def soak(
    base_url: str, model: str, pid: int, seconds: float, *, workers: int = 8, warmup: float = 0.2
) -> Outcome:
    """``workers`` clients for ``seconds``; the first ``warmup`` share of the time is the warm-up."""
    outcome = Outcome()
    samples = _Samples()
    started = time.monotonic()
    until = started + seconds
    fds_idle = open_fds(pid)
    await asyncio.gather(
        _sampler(pid, max(1.0, seconds / 120), until, samples),
        *(_worker(base_url, model, seed, until, samples) for seed in range(workers)),
    )
    await settled(base_url, outcome)
    fds_after = await _fds_at_rest(pid, fds_idle)
    warm = started + warmup * seconds
    after_warmup = [i for i, t in enumerate(samples.times) if t >= warm]
    rss_warm, rss_end = samples.rss[after_warmup[0]], samples.rss[-1]
    growth = rss_end / rss_warm - 1
    third = (until - warm) / 3
    first = _window(samples.latencies, warm, warm + third)
    last = _window(samples.latencies, until - third, until)
    p50_first, p50_last = percentile(first, 0.5), percentile(last, 0.5)
    outcome.figures.update(
        seconds=seconds, workers=workers, requests=len(samples.latencies) + samples.kinds.get("cancel", 0),
        kinds=samples.kinds, errors=len(samples.errors),
        rss_mib_warm=round(rss_warm / 2**20, 1), rss_mib_end=round(rss_end / 2**20, 1),
        rss_mib_max=round(max(samples.rss) / 2**20, 1), rss_growth_pct=round(growth * 100, 2),
        fds_idle_before=fds_idle, fds_idle_after=fds_after, fds_max=max(samples.fds),
        p50_ms_first_third=round(p50_first * 1000, 1), p50_ms_last_third=round(p50_last * 1000, 1),
        p95_ms_first_third=round(percentile(first, 0.95) * 1000, 1),
        p95_ms_last_third=round(percentile(last, 0.95) * 1000, 1),
    )  # fmt: skip
    outcome.problems += samples.errors[:5]
    if growth >= RSS_GROWTH_LIMIT:
        outcome.problems.append(f"RSS grew {growth:.1%} after the warm-up")
    if fds_after > fds_idle:
        outcome.problems.append(f"open descriptors at rest {fds_idle} -> {fds_after}")
    if p50_last > LATENCY_DRIFT_LIMIT * p50_first:
        outcome.problems.append(f"p50 drifted {p50_first * 1000:.0f} -> {p50_last * 1000:.0f} ms")
    return outcome
