"""Hostile clients against a live server: clients that vanish mid-stream, slow and idle connections, and
bodies over the size limit (the flood beyond the queue bound: flood.py). Each scenario returns its figures
and the list of what went wrong (empty: the scenario passed)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import socket
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx

from benchmarks.reliability.probes import is_ready, seconds_to_idle, summary_ms

ERROR_KEYS = {"message", "type", "param", "code"}


@dataclass
class Outcome:
    figures: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems


def completion_body(model: str, i: int, stream: bool, max_tokens: int, chat: bool = False) -> dict[str, Any]:
    text = f"request {i}: the draft proposes and the target verifies"
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": stream, "temperature": 0}
    if chat:
        body["messages"] = [{"role": "user", "content": text}]
    else:
        body["prompt"] = text
    return body


def path_for(body: dict[str, Any]) -> str:
    return "/v1/chat/completions" if "messages" in body else "/v1/completions"


def capped(problems: list[str], keep: int = 5) -> list[str]:
    return problems if len(problems) <= keep else [*problems[:keep], f"... {len(problems)} in all"]


async def settled(base_url: str, outcome: Outcome) -> None:
    """The checks every scenario ends with: the server ready, the queue gauges back at 0."""
    idle = await seconds_to_idle(base_url)
    outcome.figures["seconds_to_idle"] = idle
    if idle is None:
        outcome.problems.append("queue gauges not back at 0 within 30 s")
    if not await is_ready(base_url):
        outcome.problems.append("server not ready afterwards")


# ------------------------------------------------------------------------------------------ disconnects
async def disconnects(
    base_url: str,
    model: str,
    count: int = 1000,
    *,
    concurrency: int = 50,
    seed: int = 0,
    max_tokens: int = 48,
) -> Outcome:
    """``count`` clients, ``concurrency`` at a time (at most the server's batch + queue bound, so that no
    request is refused); nine in ten vanish at a random point (before the
    answer, after the headers, after some events; streamed or not) and one in ten reads to the end, and must
    get a whole answer. Afterwards every slot is free."""
    outcome = Outcome()
    rng = random.Random(seed)
    plans = [(i, rng.random() < 0.1, rng.randint(-1, 12), rng.random() * 0.05) for i in range(count)]
    gate = asyncio.Semaphore(concurrency)
    innocent_ok = innocent = vanished = 0

    async def innocent_request(client: httpx.AsyncClient, body: dict[str, Any]) -> str | None:
        async with client.stream("POST", path_for(body), json=body) as response:
            content = await response.aread()
        if response.status_code != 200:
            return f"innocent request got {response.status_code}: {content[:120]!r}"
        if body["stream"] and (not content.endswith(b"data: [DONE]\n\n") or b'"error"' in content):
            return f"innocent stream ended badly: {content[-160:]!r}"
        return None

    async def vanishing(client: httpx.AsyncClient, body: dict[str, Any], events: int, delay: float) -> None:
        if events < 0:  # gone before the answer: cancelled after a random delay
            with contextlib.suppress(asyncio.TimeoutError, httpx.HTTPError):
                await asyncio.wait_for(client.post(path_for(body), json=body), delay)
            return
        async with client.stream("POST", path_for(body), json=body) as response:
            seen = 0
            async for _ in response.aiter_lines():
                seen += 1
                if seen > events:
                    break  # leaving the block closes the connection mid-stream

    async def one(plan: tuple[int, bool, int, float]) -> None:
        nonlocal innocent_ok, innocent, vanished
        i, is_innocent, events, delay = plan
        body = completion_body(
            model, i, stream=events >= 0 or i % 2 == 0, max_tokens=max_tokens, chat=i % 3 == 0
        )
        async with gate, httpx.AsyncClient(base_url=base_url, timeout=60) as client:
            if is_innocent:
                innocent += 1
                problem = await innocent_request(client, body)
                if problem is None:
                    innocent_ok += 1
                else:
                    outcome.problems.append(problem)
            else:
                vanished += 1
                await vanishing(client, body, events, delay)

    started = time.monotonic()
    results = await asyncio.gather(*(one(p) for p in plans), return_exceptions=True)
    outcome.problems += [f"client error: {r!r}" for r in results if isinstance(r, BaseException)]
    outcome.problems = capped(outcome.problems)
    outcome.figures.update(
        clients=count, vanished=vanished, innocent=innocent, innocent_ok=innocent_ok,
        wall_seconds=round(time.monotonic() - started, 2),
    )  # fmt: skip
    await settled(base_url, outcome)
    return outcome


# -------------------------------------------------------------------------------------- slow clients
async def _probe_latencies(base_url: str, model: str, requests: int) -> tuple[list[float], int]:
    latencies, failed = [], 0
    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        for i in range(requests):
            body = completion_body(model, i, stream=False, max_tokens=4)
            started = time.monotonic()
            response = await client.post("/v1/completions", json=body)
            latencies.append(time.monotonic() - started)
            failed += response.status_code != 200
    return latencies, failed


async def _hold_slow_connection(
    host: str, port: int, kind: int, stop: asyncio.Event, stalled: asyncio.Event
) -> bool:
    """One slow or idle connection until ``stop``: partial headers trickled a byte a second, a body that
    stops short of its Content-Length, or an idle keep-alive after one request; ``stalled`` is set once it
    is (or once it failed). True: the server closed it."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
    except BaseException:
        stalled.set()
        raise
    try:
        if kind == 0:
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        elif kind == 1:
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
            writer.write(b'Content-Length: 4096\r\n\r\n{"model": "')
        else:
            writer.write(b"GET /health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        if kind == 2:
            await _response_head(reader)  # then idle on the kept-alive connection
        stalled.set()
        while not stop.is_set():
            if kind == 0:
                writer.write(b"X")  # slowloris: one more byte of a header that never ends
                await writer.drain()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 1.0)
            if reader.at_eof():
                return True
        return False
    except ConnectionError:
        return True
    finally:
        stalled.set()
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()


async def slow_clients(
    base_url: str,
    model: str,
    connections: int = 200,
    probe_requests: int = 40,
    *,
    hold_seconds: float = 0.0,
    floor_ms: float | None = 0.0,
) -> Outcome:
    """Latency of ordinary requests before, and while ``connections`` slow or idle connections are open: the
    p95 while they are open is at most twice the one before plus 50 ms, or ``floor_ms`` where that is more (a
    server that shares its process with the clients sees their wake-ups as stalls; one that waits on slow
    clients stalls for seconds). ``floor_ms=None`` bounds no latency (a test's use): every ordinary request
    is answered while the slow connections are held, which a server waiting on them never does."""
    outcome = Outcome()
    split = urlsplit(base_url)
    host, port = split.hostname or "127.0.0.1", split.port or 80
    before, failed_before = await _probe_latencies(base_url, model, probe_requests)
    stop = asyncio.Event()
    stalled = [asyncio.Event() for _ in range(connections)]
    holders = [
        asyncio.ensure_future(_hold_slow_connection(host, port, i % 3, stop, stalled[i]))
        for i in range(connections)
    ]
    await asyncio.wait_for(asyncio.gather(*(event.wait() for event in stalled)), 60)  # connected and stalled
    during, failed_during = await _probe_latencies(base_url, model, probe_requests)
    held = sum(not holder.done() for holder in holders)  # still open while every probe was answered
    if hold_seconds:
        await asyncio.sleep(hold_seconds)
    stop.set()
    closed = await asyncio.gather(*holders, return_exceptions=True)
    errors = [c for c in closed if isinstance(c, BaseException)]
    outcome.problems += [f"slow connection: {e!r}" for e in errors[:3]]
    if failed_before or failed_during:
        outcome.problems.append(f"{failed_before} + {failed_during} probe requests failed")
    base, loaded = summary_ms(before), summary_ms(during)
    bound_ms = None if floor_ms is None else max(2 * base["p95_ms"] + 50, floor_ms)
    if bound_ms is not None and loaded["p95_ms"] > bound_ms:
        outcome.problems.append(f"p95 {loaded['p95_ms']} ms with slow clients > bound {bound_ms:.0f} ms")
    outcome.figures.update(
        connections=connections, probe_requests=probe_requests, before=base, during=loaded, held=held,
        bound_p95_ms=None if bound_ms is None else round(bound_ms, 1),
        closed_by_server=sum(c is True for c in closed),
    )  # fmt: skip
    await settled(base_url, outcome)
    return outcome


# ------------------------------------------------------------------------------------- oversized bodies
async def _response_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {
        k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)
    }
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return int(lines[0].split()[1]), headers, body


async def oversized(base_url: str, limit: int) -> Outcome:
    """Bodies over ``limit``: a declared Content-Length of 1 GiB with nothing sent, a body of 2 x the limit
    with its Content-Length (sent whole, then the answer read) and one sent chunked (httpx) each get 413 in
    the OpenAI error shape; a chunked body meant to be 64 MiB is cut off long before it could have been read
    whole."""
    outcome = Outcome()
    split = urlsplit(base_url)
    host, port = split.hostname or "127.0.0.1", split.port or 80
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"

    reader, writer = await asyncio.open_connection(host, port)
    started = time.monotonic()
    writer.write(f"{head}Content-Length: {1 << 30}\r\n\r\n".encode())
    await writer.drain()
    status, _, body = await asyncio.wait_for(_response_head(reader), 10)
    outcome.figures["declared_1GiB_ms"] = round((time.monotonic() - started) * 1000, 1)
    writer.close()
    _check_413(outcome, "declared 1 GiB", status, body)

    payload = b'{"model": "' + b"x" * (2 * limit) + b'"}'
    started = time.monotonic()
    sized = await asyncio.to_thread(send_then_read, host, port, head, payload)
    outcome.figures["sized_2x_ms"] = round((time.monotonic() - started) * 1000, 1)
    outcome.figures["sized_2x_body_cut_off"] = sized.cut_off
    if sized.status is None:
        outcome.problems.append(f"sized 2 x limit: no answer read ({sized.error})")
    else:
        _check_413(outcome, "sized 2 x limit", sized.status, sized.body)

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(payload), 8192):
            yield payload[i : i + 8192]

    async with httpx.AsyncClient(base_url=base_url, timeout=30) as client:
        started = time.monotonic()
        response = await client.post("/v1/completions", content=chunks())
        outcome.figures["chunked_2x_ms"] = round((time.monotonic() - started) * 1000, 1)
        _check_413(outcome, "chunked 2 x limit", response.status_code, response.content)

    sent, planned = await asyncio.wait_for(_endless_chunked(host, port, head), 30)
    if sent >= planned:
        outcome.problems.append("the 64 MiB chunked body was read whole")
    outcome.figures.update(limit_bytes=limit, endless_sent_bytes=sent, endless_planned_bytes=planned)
    await settled(base_url, outcome)
    return outcome


@dataclass
class _Answer:
    status: int | None
    body: bytes
    cut_off: bool  # the server closed the connection before the whole body was sent
    error: str | None = None


def send_then_read(host: str, port: int, head: str, payload: bytes) -> _Answer:
    """Send ``payload`` with its Content-Length, then read the answer, as curl or a blocking client does
    (one socket, no event loop). A server that refused the body stops reading it and closes: the rest of the
    body then fails to go out (reset), but the answer sent before the reset is still read from the socket.
    Asynchronous clients (httpx on asyncio) drop the connection at that failed write, answer unread, so
    whether they see the 413 is a race; the server's answer is what this scenario checks."""
    with socket.create_connection((host, port), timeout=10) as sock:
        cut_off = False
        try:
            sock.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        except OSError:
            cut_off = True
        data = b""
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except OSError as exc:
            if not data:
                return _Answer(None, b"", cut_off, repr(exc))
    head_bytes, _, body = data.partition(b"\r\n\r\n")
    status_line = head_bytes.split(b"\r\n", 1)[0].split()
    if len(status_line) < 2 or not status_line[1].isdigit():
        return _Answer(None, b"", cut_off, f"not an HTTP response: {data[:80]!r}")
    return _Answer(int(status_line[1]), body, cut_off)


async def _endless_chunked(host: str, port: int, head: str) -> tuple[int, int]:
    """Send up to 64 MiB chunked; return how much went out before the server answered or cut it off."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(f"{head}Transfer-Encoding: chunked\r\n\r\n".encode())
    chunk, sent, planned = b"x" * 16384, 0, 64 << 20
    answered = asyncio.ensure_future(reader.read(1))  # the first byte of an answer, or the end
    with contextlib.suppress(ConnectionError):
        while sent < planned and not answered.done():
            writer.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
            await writer.drain()
            sent += len(chunk)
    answered.cancel()
    with contextlib.suppress(asyncio.CancelledError, ConnectionError):
        await answered
    writer.close()
    return sent, planned


def _check_413(outcome: Outcome, what: str, status: int, body: bytes) -> None:
    if status != 413:
        outcome.problems.append(f"{what}: status {status}, not 413")
        return
    error = json.loads(body).get("error", {})
    if set(error) != ERROR_KEYS or error.get("code") != "request_too_large":
        outcome.problems.append(f"{what}: 413 body is not the OpenAI error shape: {body[:120]!r}")
