"""The admission gate: while the queue is full (or the server drains), a generation request is refused 503 at
its headers, before its body is read; everything else goes on as before."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from specdeploy_server.api.admission import AdmissionGate
from specdeploy_server.api.app import app_state, create_app
from specdeploy_server.api.errors import queue_full_error
from specdeploy_server.backends.standin import standin_engine
from specdeploy_server.core.scheduler import QueueFullError, SchedulerSettings
from specdeploy_server.core.types import SamplingParams
from specdeploy_server.engine import Engine
from starlette.types import Message, Receive, Scope, Send

from tests.conftest import wait_for
from tests.server.conftest import LiveServer, run_live

KEY = "sk-admission"
ERROR_KEYS = {"message", "type", "param", "code"}


def _served(api_key: str | None = None) -> tuple[object, Engine]:
    """One batch slot and one queue place; steps slow enough that two long streams keep the queue full."""
    settings = SchedulerSettings(max_model_len=2048, max_batch_size=1, max_queue_size=1, draft_len=0)
    engine, _ = standin_engine(0.01, None, alpha=0.7, settings=settings)
    return create_app(engine, api_key=api_key), engine


@contextlib.contextmanager
def _full_queue(live: LiveServer, engine: Engine, headers: dict[str, str] | None = None) -> Iterator[None]:
    """Two long streams: one runs, one waits; the queue is full until the block ends."""
    body = {"model": "standin", "prompt": "hello", "max_tokens": 1500, "stream": True}
    with (
        httpx.Client(base_url=live.base_url, timeout=10, headers=headers) as http,
        http.stream("POST", "/v1/completions", json=body) as first,
        http.stream("POST", "/v1/completions", json=body),
    ):
        lines = first.iter_lines()
        next(lines)
        wait_for(engine.queue_full, timeout=30, interval=0.01, what="the queue full")
        yield
    wait_for(lambda: engine.queue_depth == 0, timeout=30, interval=0.01, what="the queue empty")


def _connect(live: LiveServer) -> socket.socket:
    split = urlsplit(live.base_url)
    return socket.create_connection((split.hostname or "127.0.0.1", split.port or 80), timeout=5)


def _head(path: str, length: int, extra: str = "") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n{extra}\r\n"
    ).encode()


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before a response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, "connection closed in the middle of the body"
        body += chunk
    return int(lines[0].split()[1]), headers, body


def _assert_queue_full(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 503, body
    assert headers["retry-after"] == "1"
    assert headers["content-type"] == "application/json"
    error = json.loads(body)["error"]
    assert set(error) == ERROR_KEYS
    assert (error["type"], error["code"]) == ("overloaded_error", "queue_full")


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_full_queue_refuses_at_the_headers_while_the_body_never_arrives(path: str) -> None:
    app, engine = _served()
    with run_live(app) as live, _full_queue(live, engine), _connect(live) as sock:
        # Not one byte of the body: a server that waited for it would never answer (the socket's timeout
        # ends the test), so an answer at all is the refusal at the headers.
        sock.sendall(_head(path, 100_000))
        _assert_queue_full(*_read_response(sock))


def test_the_body_a_refusal_left_unread_is_discarded_and_the_connection_kept() -> None:
    app, engine = _served()
    body = json.dumps({"model": "standin", "prompt": "hello", "max_tokens": 3}).encode()
    with run_live(app) as live, _full_queue(live, engine), _connect(live) as sock:
        sock.sendall(_head("/v1/completions", len(body)))
        _assert_queue_full(*_read_response(sock))
        sock.sendall(body)  # late: the refusal did not wait for it
        sock.sendall(b"GET /health/live HTTP/1.1\r\nHost: test\r\n\r\n")
        status, _, live_body = _read_response(sock)
        assert (status, json.loads(live_body)) == (200, {"status": "ok"})


def test_a_queue_with_room_lets_the_request_through_to_read_its_body() -> None:
    app, _ = _served()
    body = json.dumps({"model": "standin", "prompt": "hello", "max_tokens": 3}).encode()
    with run_live(app) as live, _connect(live) as sock:
        sock.sendall(_head("/v1/completions", len(body)))
        sock.settimeout(0.5)
        with pytest.raises(TimeoutError):  # the handler waits for the body
            sock.recv(1)
        sock.settimeout(5)
        sock.sendall(body)
        status, _, answer = _read_response(sock)
        assert status == 200, answer
        assert json.loads(answer)["usage"]["completion_tokens"] == 3


def test_health_metrics_and_the_model_list_are_never_gated() -> None:
    app, engine = _served()
    with run_live(app) as live, _full_queue(live, engine), httpx.Client(base_url=live.base_url) as http:
        assert http.get("/health/live").status_code == 200
        assert http.get("/health/ready").status_code == 200
        assert http.get("/v1/models").json()["data"][0]["id"] == "standin"
        metrics = http.get("/metrics").text
        assert "specdeploy_queue_depth" in metrics


def test_a_request_without_the_api_key_gets_401_even_when_the_queue_is_full() -> None:
    app, engine = _served(api_key=KEY)
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "standin", "prompt": "hello", "max_tokens": 3}
    with (
        run_live(app) as live,
        _full_queue(live, engine, headers=auth),
        httpx.Client(base_url=live.base_url, timeout=5) as http,
    ):
        missing = http.post("/v1/completions", json=body)
        wrong = http.post("/v1/completions", json=body, headers={"Authorization": "Bearer nope"})
        chat = {"model": "standin", "messages": [{"role": "user", "content": "hello"}]}
        right = http.post("/v1/chat/completions", json=chat, headers=auth)
    assert (missing.status_code, missing.json()["error"]["code"]) == (401, "invalid_api_key")
    assert (wrong.status_code, wrong.json()["error"]["code"]) == (401, "invalid_api_key")
    _assert_queue_full(right.status_code, dict(right.headers), right.content)


def test_the_refusals_at_the_headers_are_counted_in_the_metrics() -> None:
    app, engine = _served()
    with run_live(app) as live, _full_queue(live, engine), httpx.Client(base_url=live.base_url) as http:
        for _ in range(3):
            assert http.post("/v1/completions", content=b"not even json").status_code == 503
        metrics = http.get("/metrics").text
    samples = {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
    }
    refused = (("endpoint", "/v1/completions"), ("model", "standin"), ("status", "503"))
    assert samples[("specdeploy_requests_total", refused)] == 3
    overloaded = (("model", "standin"), ("type", "overloaded_error"))
    assert samples[("specdeploy_request_errors_total", overloaded)] == 3


def test_a_draining_server_refuses_at_the_headers_with_shutting_down() -> None:
    app, _ = _served()
    with run_live(app) as live, _connect(live) as sock:
        app_state(app).begin_drain()  # type: ignore[arg-type]
        sock.sendall(_head("/v1/completions", 100_000))
        status, headers, body = _read_response(sock)
    assert (status, headers["retry-after"]) == (503, "1")
    assert json.loads(body)["error"]["code"] == "shutting_down"


def test_the_gate_answers_without_ever_calling_receive() -> None:
    sent: list[Message] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        raise AssertionError("the application ran")

    async def receive() -> Message:
        raise AssertionError("the gate read the body")

    async def send(message: Message) -> None:
        sent.append(message)

    gate = AdmissionGate(app, refusal=queue_full_error, api_key=None)
    scope: Scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": []}
    asyncio.run(gate(scope, receive, send))
    assert sent[0]["status"] == 503
    assert (b"retry-after", b"1") in sent[0]["headers"]
    assert json.loads(sent[1]["body"])["error"]["code"] == "queue_full"


def test_the_scheduler_says_its_queue_is_full_exactly_when_the_next_request_would_be_refused() -> None:
    settings = SchedulerSettings(max_batch_size=2, max_queue_size=3, draft_len=0)
    engine, _ = standin_engine(0.01, None, alpha=0.7, settings=settings)

    async def main() -> list[bool]:
        await engine.start()
        seen = []
        generations = []
        while True:
            seen.append(engine.queue_full())
            try:
                generations.append(engine.generate([1, 2, 3], 50, SamplingParams(temperature=0.0)))
            except QueueFullError:
                break
            await asyncio.sleep(0.02)  # the loop admits waiting requests into free batch slots
        for generation in generations:
            await generation.close()
        await engine.stop(1)
        return seen

    assert asyncio.run(main()) == [False] * 5 + [True]
