"""The server over HTTP against the same engine driven directly: streamed tokens/s per stream, on a GPU.

At a GPU's step times (milliseconds), what the Python layers around the model cost per token shows: routing,
validation, detokenisation, SSE chunks, the event loop shared by every stream. This measures it with real
forwards. One process holds the engine (the reference backend, ``draftTarget``) and serves it with uvicorn on
127.0.0.1, in the same event loop as the server's command runs it; the load generator is a child process of
its own (``http_stream``'s raw keep-alive client), so its work does not share the server's interpreter lock.

* **direct**: ``concurrency`` tasks in the server's process, each calling ``engine.generate`` for one request
  after another: the engine and the step loop, no HTTP;
* **http**: as many keep-alive connections, each streaming ``/v1/completions`` (greedy, usage in the last
  chunk) one request after another.

Each client runs ``requests`` requests of ``max_tokens`` tokens; the two modes take turns, ``rounds`` windows
each, after warm-up windows (direct ones for ``warmup_seconds``, at least one, then one over HTTP). A
request's stream rate is its tokens over its time from sending to its last token; a window's per-stream
figure is the mean over its requests, its aggregate the tokens over the window's length; a figure is the
median over the mode's windows. The engine's steps in a mode's windows give its mean step time: the pace
the HTTP layer has to keep up with.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import multiprocessing
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import uvicorn
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.cli import freeze_startup_heap
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.types import SamplingParams
from specdeploy_server.engine import EngineClient
from specdeploy_testkit import sample_text

from benchmarks.server.http_stream import _Client
from benchmarks.server.listen import listening_socket, url_of

MODEL_NAME = "bench"
MODES = ("direct", "http")


@dataclass(frozen=True)
class HttpPoint:
    device: str
    concurrency: int
    mode: str  # "direct" or "http"
    stream_tok_s: float  # per stream: median over windows of the mean request rate
    aggregate_tok_s: float  # all streams: median over windows
    step_ms: float  # the engine's mean step time in the mode's windows (window seconds over steps)
    windows_stream_tok_s: list[float]


@dataclass(frozen=True)
class _Window:
    rates: list[float]  # tokens/s of each request
    tokens: int
    seconds: float
    steps: int

    @property
    def stream_tok_s(self) -> float:
        return statistics.fmean(self.rates)


def engine_config(target: Path, draft: Path, device: str, dtype: str, k: int) -> dict[str, Any]:
    return {
        "model": {"target": str(target), "draft": str(draft), "dtype": dtype},
        "speculative": {"method": "draftTarget", "draftLen": k},
        "placement": {"device": device},
        "runtime": {"maxBatchSize": 16},
    }


# ------------------------------------------------------------------------------- the HTTP load generator


def _client_process(conn: Connection) -> None:
    """The child: for each (url, bodies, concurrency, requests) received, that many streams, each sending
    ``requests`` of the bodies in turn; answers [(tokens, seconds) per request] and the window's length."""
    while True:
        job = conn.recv()
        if job is None:
            return
        conn.send(asyncio.run(_http_window(*job)))


async def _http_window(
    url: str, bodies: list[bytes], concurrency: int, requests: int
) -> tuple[list[tuple[int, float]], float]:
    client = _Client()
    done: list[tuple[int, float]] = []

    async def stream(index: int) -> None:
        for i in range(requests):
            started = time.perf_counter()
            _, tokens = await client.stream(url, bodies[(index + i * concurrency) % len(bodies)])
            done.append((tokens, time.perf_counter() - started))

    try:
        started = time.perf_counter()
        await asyncio.gather(*(stream(i) for i in range(concurrency)))
        return done, time.perf_counter() - started
    finally:
        client.close()


# ------------------------------------------------------------------------------------- the measurement


async def _direct_window(
    engine: EngineClient, prompts: list[list[int]], concurrency: int, requests: int, max_tokens: int
) -> tuple[list[tuple[int, float]], float]:
    done: list[tuple[int, float]] = []
    params = SamplingParams(temperature=0.0)

    async def stream(index: int) -> None:
        for i in range(requests):
            started = time.perf_counter()
            gen = engine.generate(prompts[(index + i * concurrency) % len(prompts)], max_tokens, params)
            tokens = sum([len(out.token_ids) async for out in gen.outputs])
            done.append((tokens, time.perf_counter() - started))

    started = time.perf_counter()
    await asyncio.gather(*(stream(i) for i in range(concurrency)))
    return done, time.perf_counter() - started


async def _serve_and_measure(
    config: dict[str, Any],
    levels: Sequence[int],
    *,
    requests: int,
    max_tokens: int,
    rounds: int,
    warmup_seconds: float,
    device_name: str,
    conn: Connection,
) -> list[HttpPoint]:
    engine = build_engine(ServerConfig.model_validate(config))
    app = create_app(engine, served_model_name=MODEL_NAME)
    freeze_startup_heap()
    sock = listening_socket()
    server = uvicorn.Server(uvicorn.Config(app, log_level="error", lifespan="on"))
    serving = asyncio.create_task(server.serve(sockets=[sock]))  # its lifespan starts the engine
    while not server.started:
        if serving.done():
            serving.result()  # raises what stopped it
            raise RuntimeError("the server stopped before it started")
        await asyncio.sleep(0.05)
    url = url_of(sock)
    texts = sample_text.prompts(16, seed=11)
    prompts = [engine.tokenizer.encode(t) for t in texts]
    bodies = [
        json.dumps(
            {
                "model": MODEL_NAME,
                "prompt": t,
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        for t in texts
    ]
    loop = asyncio.get_running_loop()

    async def window(mode: str, level: int) -> _Window:
        before = dataclasses.replace(engine.stats)
        if mode == "direct":
            done, seconds = await _direct_window(engine, prompts, level, requests, max_tokens)
        else:
            conn.send((url, bodies, level, requests))
            done, seconds = await loop.run_in_executor(None, conn.recv)
        steps = engine.stats.since(before).steps
        return _Window([t / s for t, s in done], sum(t for t, _ in done), seconds, steps)

    points: list[HttpPoint] = []
    try:
        for level in levels:
            warming = time.perf_counter()  # the engine's first seconds, connections, allocations
            while time.perf_counter() - warming < warmup_seconds:
                await window("direct", level)
            await window("http", level)
            windows: dict[str, list[_Window]] = {mode: [] for mode in MODES}
            for _ in range(rounds):
                for mode in MODES:
                    windows[mode].append(await window(mode, level))
            for mode in MODES:
                taken = windows[mode]
                step_ms = 1000 * sum(w.seconds for w in taken) / max(sum(w.steps for w in taken), 1)
                points.append(
                    HttpPoint(
                        device_name,
                        level,
                        mode,
                        statistics.median(w.stream_tok_s for w in taken),
                        statistics.median(w.tokens / w.seconds for w in taken),
                        step_ms,
                        [w.stream_tok_s for w in taken],
                    )
                )
    finally:
        server.should_exit = True
        await serving
        sock.close()
    return points


def run_on(
    target: Path,
    draft: Path,
    *,
    device: str,
    dtype: str,
    device_name: str,
    levels: Sequence[int] = (1, 16),
    k: int = 4,
    requests: int = 3,
    max_tokens: int = 128,
    rounds: int = 2,
    warmup_seconds: float = 0.0,
) -> list[HttpPoint]:
    parent, child = multiprocessing.get_context("spawn").Pipe()
    client = multiprocessing.get_context("spawn").Process(target=_client_process, args=(child,), daemon=True)
    client.start()
    try:
        return asyncio.run(
            _serve_and_measure(
                engine_config(target, draft, device, dtype, k),
                levels,
                requests=requests,
                max_tokens=max_tokens,
                rounds=rounds,
                warmup_seconds=warmup_seconds,
                device_name=device_name,
                conn=parent,
            )
        )
    finally:
        parent.send(None)
        client.join(timeout=10)
        if client.is_alive():
            client.kill()


def table(points: Sequence[HttpPoint]) -> str:
    lines = [
        "| concurrency | driven | tok/s per stream | vs direct | tok/s, all streams | engine step (ms) "
        "| windows, tok/s per stream |",
        "|---:|---|---:|---:|---:|---:|---|",
    ]
    direct = {p.concurrency: p.stream_tok_s for p in points if p.mode == "direct"}
    for p in points:
        ratio = p.stream_tok_s / direct[p.concurrency] if p.concurrency in direct else float("nan")
        windows = " ".join(f"{w:.0f}" for w in p.windows_stream_tok_s)
        lines.append(
            f"| {p.concurrency} | {'over HTTP' if p.mode == 'http' else 'directly'} | {p.stream_tok_s:.0f} "
            f"| {ratio:.2f} | {p.aggregate_tok_s:.0f} | {p.step_ms:.1f} | {windows} |"
        )
    return "\n".join(lines)
