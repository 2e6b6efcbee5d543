"""Benchmark 5: event-loop lag of the server under HTTP work that must not steal the step loop.

The server (``create_app`` over stand-in executors, served by uvicorn) runs in a child process, so the load
generator's CPU does not share its interpreter; a probe task on the server's event loop sleeps 1 ms again
and again and records how late it wakes (the lag every stream and the step loop see). Two scenarios:

* **waiting**: 1000 non-streamed requests wait for a batch slot (``maxBatchSize`` 8, each running request
  long), measured for a few seconds once all are queued; also the server's CPU (all threads) over the window.
* **huge prompt**: one stream is running (a token every 5 ms) when a ~200k-token prompt arrives
  (Hugging Face BPE tokenizer: the tests' tiny one). With ``max_model_len`` 4096 it cannot fit (400); with
  262144 it fits and is queued. Measured over the huge request's handling; also the longest gap between the
  stream's events in that window.

python -m benchmarks.server --only 5            # as part of the server benchmarks
python -m benchmarks.server.loop_lag            # print the table only
"""

from __future__ import annotations

import asyncio
import itertools
import multiprocessing
import resource
import socket
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from benchmarks.server.listen import listening_socket, url_of

VERIFY_SECONDS = 0.005
PROBE_SECONDS = 0.001
HUGE_REQUESTS = 3


@dataclass(frozen=True)
class LagResult:
    scenario: str
    p50_ms: float
    p99_ms: float
    max_ms: float
    cpu_percent: float
    queue_depth: float | None = None  # waiting: requests queued when the window opened
    http_statuses: str | None = None  # huge prompt: the huge requests' status codes
    longest_gap_ms: float | None = None  # huge prompt: longest gap between the stream's events

    @property
    def note(self) -> str:
        if self.queue_depth is not None:
            return f"queue depth {self.queue_depth:.0f}"
        return (
            f"{HUGE_REQUESTS} huge requests: HTTP {self.http_statuses}; "
            f"longest gap between stream events {self.longest_gap_ms or 0.0:.0f} ms"
        )


# ------------------------------------------------------------------------------------- the server (child)
def _serve(sock: socket.socket, tokenizer_dir: str | None, max_model_len: int, max_batch_size: int) -> None:
    import uvicorn  # noqa: PLC0415
    from fastapi import FastAPI  # noqa: PLC0415
    from specdeploy_server.api.app import create_app  # noqa: PLC0415
    from specdeploy_server.backends import standin  # noqa: PLC0415
    from specdeploy_server.backends.standin import CharTokenizer, StandInTarget  # noqa: PLC0415
    from specdeploy_server.core.drafters import NoDrafter  # noqa: PLC0415
    from specdeploy_server.core.scheduler import SchedulerSettings, SpeculativeScheduler  # noqa: PLC0415
    from specdeploy_server.engine import Engine, model_info  # noqa: PLC0415
    from specdeploy_server.tokenizer import HFTokenizer, Tokenizer  # noqa: PLC0415

    _raise_fd_limit()
    # The stand-in spins the last 1.5 ms of each call for timing precision (benchmark 1); here that spin
    # would be charged to the loop as lag: sleep only.
    standin.SPIN_SECONDS = 0.0
    settings = SchedulerSettings(
        max_batch_size=max_batch_size, max_queue_size=4096, max_model_len=max_model_len, draft_len=0
    )
    tokenizer: Tokenizer = HFTokenizer(Path(tokenizer_dir)) if tokenizer_dir else CharTokenizer()
    words = tokenizer.encode(" hello world speculative decoding draft target", add_special_tokens=False)
    target = StandInTarget(VERIFY_SECONDS, 0.0, vocab=words)  # tokens that decode to whole words
    scheduler = SpeculativeScheduler(target, NoDrafter(), settings)
    app: FastAPI = create_app(Engine(tokenizer, scheduler, model_info("bench", max_model_len)))
    samples: list[float] = []
    probe: dict[str, Any] = {}

    async def run_probe() -> None:
        while True:
            started = time.perf_counter()
            await asyncio.sleep(PROBE_SECONDS)
            samples.append(time.perf_counter() - started - PROBE_SECONDS)

    async def start() -> dict[str, Any]:
        samples.clear()
        probe["cpu"], probe["wall"] = time.process_time(), time.perf_counter()
        probe["task"] = asyncio.get_running_loop().create_task(run_probe())
        return {}

    async def stop() -> dict[str, Any]:
        probe["task"].cancel()
        cpu = (time.process_time() - probe["cpu"]) / (time.perf_counter() - probe["wall"])
        return {"samples": list(samples), "cpu": cpu}

    app.add_api_route("/bench/lag/start", start, methods=["POST"])
    app.add_api_route("/bench/lag/stop", stop, methods=["POST"])
    uvicorn.Server(uvicorn.Config(app, log_level="error")).run(sockets=[sock])


def _raise_fd_limit() -> None:
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class _Server:
    def __init__(self, tokenizer_dir: Path | None, max_model_len: int, max_batch_size: int = 8) -> None:
        self.sock = listening_socket()  # handed to the child: no other process can take the port meanwhile
        context = multiprocessing.get_context("spawn")
        self.process = context.Process(
            target=_serve,
            args=(self.sock, str(tokenizer_dir) if tokenizer_dir else None, max_model_len, max_batch_size),
            daemon=True,
        )
        self.base_url = url_of(self.sock)

    def __enter__(self) -> _Server:
        self.process.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{self.base_url}/health/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("the benchmark server did not start")

    def __exit__(self, *exc: object) -> None:
        self.process.terminate()
        self.process.join(timeout=10)
        self.sock.close()


def _summary(scenario: str, stopped: dict[str, Any], **details: Any) -> LagResult:
    samples = sorted(stopped["samples"]) or [0.0]
    p99 = samples[min(len(samples) - 1, int(len(samples) * 0.99))]
    return LagResult(
        scenario,
        statistics.median(samples) * 1000,
        p99 * 1000,
        samples[-1] * 1000,
        stopped["cpu"] * 100,
        **details,
    )


# ------------------------------------------------------------------------------------- the scenarios
async def _depth(client: httpx.AsyncClient) -> float:
    for line in (await client.get("/metrics")).text.splitlines():
        if line.startswith("specdeploy_queue_depth{"):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _waiting(base_url: str, requests: int, seconds: float) -> LagResult:
    limits = httpx.Limits(max_connections=requests + 16, max_keepalive_connections=requests + 16)
    async with httpx.AsyncClient(base_url=base_url, timeout=None, limits=limits) as client:
        body = {"model": "bench", "prompt": "hello", "max_tokens": 4000}
        tasks = [asyncio.ensure_future(client.post("/v1/completions", json=body)) for _ in range(requests)]
        deadline = time.monotonic() + 60
        while await _depth(client) < requests and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        depth = await _depth(client)
        await asyncio.sleep(0.5)
        await client.post("/bench/lag/start")
        await asyncio.sleep(seconds)
        stopped = (await client.post("/bench/lag/stop")).json()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return _summary(f"{requests} waiting non-streamed requests", stopped, queue_depth=depth)


async def _huge_prompt(base_url: str, text: str, tokens: int, label: str) -> LagResult:
    async with httpx.AsyncClient(base_url=base_url, timeout=120) as client:
        arrivals: list[float] = []

        async def stream() -> None:
            body = {"model": "bench", "prompt": "hello", "max_tokens": 4000, "stream": True}
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        arrivals.append(time.perf_counter())

        streaming = asyncio.ensure_future(stream())
        await asyncio.sleep(1.0)
        await client.post("/bench/lag/start")
        window = time.perf_counter()
        statuses = set()
        for _ in range(HUGE_REQUESTS):  # one after another: each one's handling is in the window
            big = {"model": "bench", "prompt": text, "max_tokens": 1}
            statuses.add((await client.post("/v1/completions", json=big)).status_code)
            await asyncio.sleep(0.2)
        stopped = (await client.post("/bench/lag/stop")).json()
        streaming.cancel()
        await asyncio.gather(streaming, return_exceptions=True)
    in_window = [t for t in arrivals if t >= window]
    gap = max((b - a for a, b in itertools.pairwise(in_window)), default=0.0)
    return _summary(
        f"~{tokens // 1000}k-token prompt during a stream, {label}",
        stopped,
        http_statuses=", ".join(map(str, sorted(statuses))),
        longest_gap_ms=gap * 1000,
    )


def _huge_text(tokenizer_dir: Path, tokens: int) -> tuple[str, int]:
    from specdeploy_server.tokenizer import HFTokenizer  # noqa: PLC0415
    from specdeploy_testkit import sample_text  # noqa: PLC0415

    tokenizer = HFTokenizer(tokenizer_dir)
    unit = " ".join(sample_text.corpus(400, seed=3))
    per_unit = len(tokenizer.encode(unit))
    text = " ".join([unit] * (tokens // per_unit + 1))
    return text, len(tokenizer.encode(text))


def run(requests: int = 1000, seconds: float = 5.0, prompt_tokens: int = 200_000) -> list[LagResult]:
    from specdeploy_testkit import checkpoints  # noqa: PLC0415

    _raise_fd_limit()
    results = []
    with _Server(None, 4096) as server:
        results.append(asyncio.run(_waiting(server.base_url, requests, seconds)))
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = Path(tmp)
        checkpoints.train_tokenizer(tokenizer_dir)
        text, tokens = _huge_text(tokenizer_dir, prompt_tokens)
        for max_len, label in ((4096, "max_model_len 4096 (refused)"), (262_144, "max_model_len 262144")):
            with _Server(tokenizer_dir, max_len) as server:
                results.append(asyncio.run(_huge_prompt(server.base_url, text, tokens, label)))
    return results


def table(results: list[LagResult]) -> str:
    lines = [
        "| scenario | loop lag p50 (ms) | p99 (ms) | max (ms) | server CPU (% of a core) | notes |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for r in results:
        lines.append(
            f"| {r.scenario} | {r.p50_ms:.2f} | {r.p99_ms:.2f} | {r.max_ms:.1f} | {r.cpu_percent:.0f} | "
            f"{r.note} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(run()))
