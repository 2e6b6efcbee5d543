"""Benchmark 3: streaming throughput of our HTTP layer (instant engine) vs a bare Starlette SSE endpoint.

Both apps are served by uvicorn in this process and read by the same httpx client code; each token becomes one
SSE event. The ratio isolates what our routing, validation, detokenisation and chunk building cost.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.standin import InstantEngine
from specdeploy_server.livethread import run_live
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route


@dataclass(frozen=True)
class StreamResult:
    label: str
    streams: int
    tokens_per_stream: int
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


async def _measure(base_url: str, streams: int, tokens: int) -> float:
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:

        async def one() -> int:
            body = {"model": "instant", "prompt": "hi", "max_tokens": tokens, "stream": True}
            count = 0
            async with client.stream("POST", "/v1/completions", json=body) as response:
                async for line in response.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        count += 1
            return count

        started = time.perf_counter()
        counts = await asyncio.gather(*(one() for _ in range(streams)))
        elapsed = time.perf_counter() - started
    return sum(counts) / elapsed


def run(streams: int = 8, tokens: int = 2000) -> list[StreamResult]:
    results = []
    for label, app in (("bare Starlette SSE", bare_app()), ("specdeploy /v1/completions", None)):
        served = app if app is not None else create_app(InstantEngine(), served_model_name="instant")
        with run_live(served) as live:
            asyncio.run(_measure(live.base_url, 2, 200))  # warm-up
            tok_s = asyncio.run(_measure(live.base_url, streams, tokens))
        results.append(StreamResult(label, streams, tokens, tok_s))
    return results


def table(results: list[StreamResult]) -> str:
    bare = results[0].tok_s
    lines = ["| endpoint | streams | tokens/stream | events/s | vs bare |", "|---|---:|---:|---:|---:|"]
    for r in results:
        lines.append(
            f"| {r.label} | {r.streams} | {r.tokens_per_stream} | {r.tok_s:.0f} | {r.tok_s / bare:.2f} |"
        )
    return "\n".join(lines)
