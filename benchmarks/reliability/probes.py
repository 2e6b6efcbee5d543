"""What the scenarios read from the server under test: its queue gauges, readiness, and (for a server in its
own process) resident memory and open file descriptors."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

#: the gauges that must be back at 0 once every request has ended (waiting + running, and being served)
IDLE_GAUGES = ("specdeploy_queue_depth", "specdeploy_requests_in_flight")


async def gauges(client: httpx.AsyncClient) -> dict[str, float]:
    text = (await client.get("/metrics")).text
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name in IDLE_GAUGES
    }


async def ready(client: httpx.AsyncClient) -> bool:
    return (await client.get("/health/ready")).status_code == 200


async def seconds_to_idle(base_url: str, timeout: float = 30.0) -> float | None:
    """Seconds until every idle gauge reads 0 (None: not within ``timeout``)."""
    started = time.monotonic()
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        while time.monotonic() - started < timeout:
            values = await gauges(client)
            if values and all(values.get(name, 0.0) == 0 for name in IDLE_GAUGES):
                return round(time.monotonic() - started, 3)
            await asyncio.sleep(0.05)
    return None


async def is_ready(base_url: str) -> bool:
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        return await ready(client)


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``, nearest rank; NaN for none."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def summary_ms(values: list[float]) -> dict[str, float]:
    """p50, p95, p99 and max of durations in seconds, as milliseconds."""
    return {
        "p50_ms": round(percentile(values, 0.5) * 1000, 1),
        "p95_ms": round(percentile(values, 0.95) * 1000, 1),
        "p99_ms": round(percentile(values, 0.99) * 1000, 1),
        "max_ms": round(max(values, default=float("nan")) * 1000, 1),
        "mean_ms": round(statistics.fmean(values) * 1000, 1) if values else float("nan"),
    }
