"""A flood of requests beyond the queue bound against a live server: every request is served whole or refused
503 ``queue_full`` with ``Retry-After``, refusals are fast, and the server is ready and idle afterwards."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.reliability.hostile import Outcome, capped, completion_body, path_for, settled
from benchmarks.reliability.probes import summary_ms

#: a refusal, timed by a client of its own while the queue is full, takes at most this long (p99)
PROBE_REFUSAL_BOUND_MS = 250.0
#: the most requests the probe sends during one flood
PROBE_REQUESTS = 50
REPO = Path(__file__).resolve().parents[2]


async def _start_probe(base_url: str, model: str, capacity: int) -> asyncio.subprocess.Process:
    """benchmarks/reliability/refusal_probe.py in a process of its own, returned once it is ready (its
    connection up, the queue gauge read once): it probes until its stdin closes (``_probe_results``)."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "benchmarks.reliability.refusal_probe", base_url, model, str(capacity),
        str(PROBE_REQUESTS), stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, cwd=REPO,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])},
    )  # fmt: skip
    assert process.stdout is not None
    ready = await process.stdout.readline()
    if ready.strip() != b"ready":
        process.kill()
        await process.wait()
        raise RuntimeError(f"the refusal probe did not start: {ready!r}")
    return process


async def _probe_results(process: asyncio.subprocess.Process) -> dict[str, Any]:
    """Stop the probe; its statuses and the seconds each 503 took."""
    assert process.stdin is not None
    assert process.stdout is not None
    process.stdin.close()
    output = await process.stdout.read()
    await process.wait()
    result: dict[str, Any] = json.loads(output)
    return result


async def _e2e_buckets(base_url: str) -> dict[float, float]:
    """The server's own end-to-end latency histogram of the requests it served (cumulative counts by upper
    bound, seconds)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as client:
        text = (await client.get("/metrics")).text
    return {
        float(s.labels["le"]): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "specdeploy_e2e_request_latency_seconds_bucket"
    }


def served_median_floor(before: dict[float, float], after: dict[float, float]) -> float | None:
    """A lower bound of the median server-side latency of the requests served between two scrapes: the lower
    edge of the histogram bucket that holds it (seconds; None: nothing was served)."""
    bounds = sorted(after)
    counts = [after[b] - before.get(b, 0.0) for b in bounds]
    total = counts[-1] if counts else 0.0
    if total <= 0:
        return None
    lower = 0.0
    for bound, count in zip(bounds, counts, strict=True):
        if count >= total / 2:
            return lower
        lower = bound
    return lower


async def flood(
    base_url: str,
    model: str,
    count: int = 1000,
    max_tokens: int = 32,
    *,
    capacity: int,
    probe_bound_ms: float | None = PROBE_REFUSAL_BOUND_MS,
) -> Outcome:
    """``count`` requests at once (half streamed): each is served (200) or refused (503 with
    ``Retry-After`` and ``queue_full``); nothing else.

    How fast a refusal is shows in a probe: while the flood lasts, a client in a process of its own sends a
    request whenever the queue gauge reads full (``capacity``: the batch and the queue bound) and times the
    503s. Refusals are faster than answers when the probe's median 503 is below the median time the server
    itself took to serve the flood's answers (from its own histogram: a lower bound, the edge of the median's
    bucket, so the comparison errs against the claim). The flood's own latencies are figures only: its
    client opens ``count`` connections at once on the same cores, and waiting for its own event loop
    dominates them. ``probe_bound_ms=None`` checks no time at all (a test's use: what is refused and served,
    not how fast)."""
    outcome = Outcome()
    e2e_before = await _e2e_buckets(base_url)
    limits = httpx.Limits(max_connections=count, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=120) as client:

        async def one(i: int) -> tuple[int, float, str | None]:
            body = completion_body(model, i, stream=i % 2 == 1, max_tokens=max_tokens, chat=i % 4 >= 2)
            started = time.monotonic()
            async with client.stream("POST", path_for(body), json=body) as response:
                content = await response.aread()
            elapsed = time.monotonic() - started
            if response.status_code == 503:
                error = json.loads(content)["error"]
                if response.headers.get("retry-after") != "1" or error.get("code") != "queue_full":
                    return -503, elapsed, f"503 without Retry-After/queue_full: {content[:120]!r}"
            elif response.status_code != 200 or (body["stream"] and not content.endswith(b"[DONE]\n\n")):
                return response.status_code, elapsed, f"{response.status_code}: {content[:120]!r}"
            return response.status_code, elapsed, None

        probe = await _start_probe(base_url, model, capacity)
        started = time.monotonic()
        try:
            results = await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
            wall = time.monotonic() - started
        finally:
            probed = await _probe_results(probe)
    probe_statuses, probe_refused = probed["statuses"], probed["refused_seconds"]
    served_floor = served_median_floor(e2e_before, await _e2e_buckets(base_url))
    served = [r[1] for r in results if isinstance(r, tuple) and r[0] == 200]
    refused = [r[1] for r in results if isinstance(r, tuple) and r[0] == 503]
    for r in results:
        if isinstance(r, BaseException):
            outcome.problems.append(f"request failed: {r!r}")
        elif r[2] is not None:
            outcome.problems.append(r[2])
    outcome.problems = capped(outcome.problems)
    outcome.figures.update(
        requests=count, served=len(served), refused=len(refused), wall_seconds=round(wall, 2),
        refused_latency=summary_ms(refused), served_latency=summary_ms(served),
        probe_statuses=probe_statuses, probe_refused_latency=summary_ms(probe_refused),
        served_server_p50_at_least_ms=None if served_floor is None else round(served_floor * 1000, 1),
    )  # fmt: skip
    _check(outcome, probe_refused, probe_bound_ms)
    await settled(base_url, outcome)
    return outcome


def _check(outcome: Outcome, probe_refused: list[float], probe_bound_ms: float | None) -> None:
    figures = outcome.figures
    if not probe_refused:
        outcome.problems.append(f"the probe got no 503 while the queue was full: {figures['probe_statuses']}")
    elif probe_bound_ms is not None and figures["probe_refused_latency"]["p99_ms"] > probe_bound_ms:
        outcome.problems.append(f"probe refusals p99 over {probe_bound_ms} ms")
    if not figures["refused"]:
        outcome.problems.append("no request was refused: the flood did not reach the queue bound")
    if probe_bound_ms is not None and probe_refused and figures["served"]:
        refusal_p50 = figures["probe_refused_latency"]["p50_ms"]
        floor = figures["served_server_p50_at_least_ms"]
        if floor is None or refusal_p50 >= floor:
            outcome.problems.append(
                f"refusals not faster than answers: probe 503 p50 {refusal_p50} ms, served p50 >= {floor} ms"
            )
