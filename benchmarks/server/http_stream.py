"""Benchmark 3: streaming throughput of our HTTP layer (instant engine) vs a bare Starlette SSE endpoint.

Each app is served by uvicorn in a child process of its own (so the client's work and the server's do not
share one interpreter lock) and read by the same httpx client code. The bare endpoint
sends one SSE event per token. Our endpoint runs over ``InstantEngine`` in two modes: *per token* (the engine
emits one token per step, so one event per token: the ratio to the bare endpoint isolates what our routing,
validation, detokenisation and chunk building cost) and *per step* (``tokens_per_step`` tokens per step, as a
speculative step emits its accepted tokens, and they go out as one event: the gain over per-token mode is
what speculation saves the streaming layer). Tokens are counted from each stream's final ``usage`` where it
has one, else one per event. The three are served side by side and measured in turn, several rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import httpx
import uvicorn
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.standin import InstantEngine
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

#: tokens per step in per-step mode (a speculative step's accepted tokens plus the target's own)
TOKENS_PER_STEP = 4


@dataclass(frozen=True)
class StreamResult:
    label: str
    tokens_per_step: int
    streams: int
    tokens_per_stream: int
    events_s: float
    tok_s: float


def bare_app() -> Starlette:
    async def endpoint(request: Request) -> StreamingResponse:
        body = await request.json()
        n = int(body["max_tokens"])

        async def events() -> AsyncIterator[str]:
            for i in range(n):
                chunk = {
                    "id": "x",
                    "object": "text_completion",
                    "choices": [{"index": 0, "text": chr(97 + i % 26)}],
                }
                yield f"data: {json.dumps(chunk)}\n\n"
                await asyncio.sleep(0)
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", endpoint, methods=["POST"])])


async def _measure(base_url: str, streams: int, tokens: int) -> tuple[float, float]:
    """Events/s and tokens/s of ``streams`` concurrent streams of ``tokens`` tokens each."""
    async with httpx.AsyncClient(
        base_url=base_url, timeout=120, limits=httpx.Limits(max_connections=None)
    ) as client:

        async def one() -> tuple[int, int]:
            body = {"model": "instant", "prompt": "hi", "max_tokens": tokens, "stream": True}
            events = 0
            last = ""
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        events += 1
                        last = line
            usage = json.loads(last[6:]).get("usage") if last else None
            return events, usage["completion_tokens"] if usage else events

        started = time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(streams)))
        elapsed = time.perf_counter() - started
    received = sum(c[1] for c in counts)
    if received != streams * tokens:
        raise RuntimeError(f"{received} tokens received, {streams * tokens} expected")
    return sum(c[0] for c in counts) / elapsed, received / elapsed


def _serve(port: int, tokens_per_step: int, bare: bool) -> None:
    """The child process: one app on ``port`` until terminated."""
    app = bare_app() if bare else create_app(InstantEngine(tokens_per_step), served_model_name="instant")
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", backlog=1024)


@contextlib.contextmanager
def _served(tokens_per_step: int, bare: bool) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    process = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(port, tokens_per_step, bare), daemon=True
    )
    process.start()
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or not process.is_alive():
                    raise RuntimeError("the benchmark server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.join(timeout=10)


def run(
    configs: tuple[tuple[int, int], ...] = ((8, 2000), (64, 500)),
    tokens_per_step: int = TOKENS_PER_STEP,
    rounds: int = 3,
) -> list[StreamResult]:
    """For each (streams, tokens per stream): the bare endpoint, ours per token and ours per step, all three
    served at once and measured in turn, ``rounds`` times (the machine's load changes within seconds, so
    each endpoint's figure is its total over the rounds, taken in the same seconds as the others')."""
    servers = [
        ("bare Starlette SSE", 1, True),
        ("specdeploy, per token", 1, False),
        ("specdeploy, per step", tokens_per_step, False),
    ]
    results = []
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(_served(per_step, bare)) for _, per_step, bare in servers]
        for url in urls:
            asyncio.run(_measure(url, 2, 200))  # warm-up
        for streams, tokens in configs:
            seconds = [0.0] * len(servers)
            events = [0.0] * len(servers)
            for _ in range(rounds):
                for i, url in enumerate(urls):
                    events_s, tok_s = asyncio.run(_measure(url, streams, tokens))
                    seconds[i] += streams * tokens / tok_s
                    events[i] += events_s * streams * tokens / tok_s
            for (label, per_step, _), spent, sent in zip(servers, seconds, events, strict=True):
                total = rounds * streams * tokens
                results.append(StreamResult(label, per_step, streams, tokens, sent / spent, total / spent))
    return results


def table(results: list[StreamResult]) -> str:
    lines = [
        "| endpoint | tokens/event | streams | tokens/stream | events/s | tokens/s | vs bare "
        "| vs per token |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    bare: dict[int, float] = {}
    per_token: dict[int, float] = {}
    for r in results:
        if r.label.startswith("bare"):
            bare[r.streams] = r.tok_s
        elif r.tokens_per_step == 1:
            per_token[r.streams] = r.tok_s
    for r in results:
        vs_bare = f"{r.tok_s / bare[r.streams]:.2f}" if r.streams in bare else ""
        vs_token = (
            f"{r.tok_s / per_token[r.streams]:.2f}"
            if r.streams in per_token and not r.label.startswith("bare")
            else ""
        )
        lines.append(
            f"| {r.label} | {r.tokens_per_step} | {r.streams} | {r.tokens_per_stream} | {r.events_s:.0f} "
            f"| {r.tok_s:.0f} | {vs_bare} | {vs_token} |"
        )
    return "\n".join(lines)
