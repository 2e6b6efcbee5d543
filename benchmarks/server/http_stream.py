"""Benchmark 3: streaming throughput of our HTTP layer (instant engine) vs a bare Starlette SSE endpoint.

Each app is served by uvicorn in a child process of its own (so the client's work and the server's do not
share one interpreter lock) and read by the same load generator (``_Client``): keep-alive connections, one per
concurrent stream, reused from round to round as a client library's pool does, and raw bytes in, with reads
coalesced, so that the servers set the pace. (An httpx client that parsed every line used as much CPU as the
measured wall time: it measured the client, not the servers; the bare endpoint then streamed about 12 000
events/s instead of about 60 000.) The bare endpoint
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

import uvicorn
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.standin import InstantEngine
from specdeploy_server.cli import freeze_startup_heap
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from benchmarks.server.listen import listening_socket, url_of

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


#: a stream's socket is read at most this often: what arrived meanwhile is read at once (the kernel keeps it),
#: so the client's cost per event does not grow with the events, only with the time
READ_EVERY_SECONDS = 0.002
#: the end of a chunked body: the last data chunk's CRLF, the zero-size chunk, the empty trailer
_LAST_CHUNK = b"\r\n0\r\n\r\n"


class _Connection(asyncio.Protocol):
    """One keep-alive HTTP/1.1 connection of the load generator, as a client library's pool keeps them: one
    request at a time, its whole response collected as bytes (read at most every ``READ_EVERY_SECONDS``)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.raw = bytearray()
        self.done: asyncio.Future[bytes] | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def request(self, data: bytes) -> asyncio.Future[bytes]:
        assert self.transport is not None
        assert self.done is None
        self.raw.clear()
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(data)
        return self.done

    def data_received(self, data: bytes) -> None:
        self.raw += data
        if self.raw.endswith(_LAST_CHUNK) and self.done is not None:
            done, self.done = self.done, None
            done.set_result(bytes(self.raw))
            return
        assert self.transport is not None
        self.transport.pause_reading()
        asyncio.get_running_loop().call_later(READ_EVERY_SECONDS, self._resume)

    def _resume(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.done is not None and not self.done.done():
            self.done.set_exception(exc or ConnectionError(f"closed mid-response: {bytes(self.raw[:200])!r}"))


class _Client:
    """The load generator: a pool of keep-alive connections per server (one per concurrent stream, reused
    across rounds, as the OpenAI SDK's pool does), raw bytes in, no per-event parsing: a stream's events are
    counted once its body is complete. It does as little as a load generator should, so that the servers,
    not the client sharing their two CPUs, set the pace."""

    def __init__(self) -> None:
        self._idle: dict[str, list[_Connection]] = {}

    async def _connection(self, url: str) -> _Connection:
        idle = self._idle.setdefault(url, [])
        while idle:
            conn = idle.pop()
            if not conn.closed:
                return conn
        host, port = url.removeprefix("http://").split(":")
        _, conn = await asyncio.get_running_loop().create_connection(_Connection, host, int(port))
        return conn

    async def stream(self, url: str, body: bytes) -> tuple[int, int]:
        """One streamed completion: (events, tokens)."""
        conn = await self._connection(url)
        head, _, rest = (
            await conn.request(
                b"POST /v1/completions HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
        ).partition(b"\r\n\r\n")
        self._idle[url].append(conn)
        if not head.startswith(b"HTTP/1.1 200") or b"transfer-encoding: chunked" not in head.lower():
            raise RuntimeError(f"the stream failed: {head[:200]!r}")
        lines = [
            line
            for line in _dechunk(rest).split(b"\n")
            if line.startswith(b"data: ") and line != b"data: [DONE]"
        ]
        usage = json.loads(lines[-1][6:]).get("usage") if lines else None
        return len(lines), usage["completion_tokens"] if usage else len(lines)

    def close(self) -> None:
        for pool in self._idle.values():
            for conn in pool:
                if conn.transport is not None:
                    conn.transport.close()


def _dechunk(body: bytes) -> bytes:
    """The payload of an HTTP/1.1 chunked body."""
    out, at = bytearray(), 0
    while True:
        end = body.index(b"\r\n", at)
        size = int(body[at:end].split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += body[end + 2 : end + 2 + size]
        at = end + 2 + size + 2


async def _measure(client: _Client, url: str, streams: int, tokens: int) -> tuple[float, float]:
    """Events/s and tokens/s of ``streams`` concurrent streams of ``tokens`` tokens each."""
    body = json.dumps({"model": "instant", "prompt": "hi", "max_tokens": tokens, "stream": True}).encode()
    started = time.perf_counter()
    counts = await asyncio.gather(*(client.stream(url, body) for _ in range(streams)))
    elapsed = time.perf_counter() - started
    received = sum(c[1] for c in counts)
    if received != streams * tokens:
        raise RuntimeError(f"{received} tokens received, {streams * tokens} expected")
    return sum(c[0] for c in counts) / elapsed, received / elapsed


def _serve(sock: socket.socket, tokens_per_step: int, bare: bool) -> None:
    """The child process: one app on the listening socket ``sock`` until terminated."""
    app = bare_app() if bare else create_app(InstantEngine(tokens_per_step), served_model_name="instant")
    freeze_startup_heap()  # the garbage collector as the server's command sets it, for both apps alike
    uvicorn.Server(uvicorn.Config(app, log_level="error")).run(sockets=[sock])


@contextlib.contextmanager
def _served(tokens_per_step: int, bare: bool) -> Iterator[str]:
    sock = listening_socket()
    process = multiprocessing.get_context("spawn").Process(
        target=_serve, args=(sock, tokens_per_step, bare), daemon=True
    )
    process.start()
    try:
        yield url_of(sock)  # connections queue in the socket's backlog until the child serves them
    finally:
        process.terminate()
        process.join(timeout=10)
        sock.close()


def run(
    configs: tuple[tuple[int, int], ...] = ((8, 2000), (64, 500)),
    tokens_per_step: int = TOKENS_PER_STEP,
    rounds: int = 6,
) -> list[StreamResult]:
    """For each (streams, tokens per stream): the bare endpoint, ours per token and ours per step, all three
    served at once and measured in turn, ``rounds`` times (the machine's load changes within seconds, so
    each endpoint's figure is its total over the rounds, taken in the same seconds as the others')."""
    servers = [
        ("bare Starlette SSE", 1, True),
        ("specdeploy, per token", 1, False),
        ("specdeploy, per step", tokens_per_step, False),
    ]
    with contextlib.ExitStack() as stack:
        urls = [stack.enter_context(_served(per_step, bare)) for _, per_step, bare in servers]
        return asyncio.run(_rounds(servers, urls, configs, rounds))


async def _rounds(
    servers: list[tuple[str, int, bool]], urls: list[str], configs: tuple[tuple[int, int], ...], rounds: int
) -> list[StreamResult]:
    client = _Client()
    try:
        for url in urls:
            await _measure(client, url, 2, 200)  # warm-up
        results = []
        for streams, tokens in configs:
            seconds = [0.0] * len(servers)
            events = [0.0] * len(servers)
            for round_ in range(rounds + 1):
                for i, url in enumerate(urls):
                    events_s, tok_s = await _measure(client, url, streams, tokens)
                    if round_ == 0:
                        continue  # opens this many connections: not measured
                    seconds[i] += streams * tokens / tok_s
                    events[i] += events_s * streams * tokens / tok_s
            for (label, per_step, _), spent, sent in zip(servers, seconds, events, strict=True):
                total = rounds * streams * tokens
                results.append(StreamResult(label, per_step, streams, tokens, sent / spent, total / spent))
        return results
    finally:
        client.close()


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
