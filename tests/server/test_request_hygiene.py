"""What every client relies on beyond the generation itself: fields the server does not implement are never
dropped without a word, ``GET /health``, a 500 that leaves the connection usable, integral numbers for integer
fields, and the served model's name in the OpenAPI document."""

from __future__ import annotations

import json
import logging
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from specdeploy_server.api.app import app_state, create_app
from specdeploy_server.api.fields import ACCEPTED, REFUSED
from specdeploy_server.backends.standin import standin_engine
from specdeploy_server.core.scheduler import SchedulerSettings

from tests.server.conftest import LiveServer, run_live

SETTINGS = SchedulerSettings(max_model_len=64, draft_len=3)


@pytest.fixture(scope="module")
def warn_server() -> Iterator[LiveServer]:
    engine, _ = standin_engine(0.0005, 0.0, alpha=0.7, settings=SETTINGS)
    with run_live(create_app(engine)) as live:
        yield live


@pytest.fixture(scope="module")
def refuse_server() -> Iterator[LiveServer]:
    engine, _ = standin_engine(0.0005, 0.0, alpha=0.7, settings=SETTINGS)
    with run_live(create_app(engine, unknown_fields="refuse")) as live:
        yield live


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _chat(client: openai.OpenAI, **extra: Any) -> Any:
    return client.chat.completions.create(
        model="standin", messages=[{"role": "user", "content": "hi"}], max_tokens=3, extra_body=extra
    )


# ------------------------------------------------------------------------------------------ unknown fields
def test_an_unknown_field_is_accepted_and_logged_by_name(
    warn_server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="specdeploy_server.api.fields")
    client = _client(warn_server)
    for _ in range(2):
        assert _chat(client, frobnicate_level=3).choices[0].finish_reason == "length"
        client.completions.create(
            model="standin", prompt="hi", max_tokens=2, extra_body={"frobnicate_level": 3}
        )
    named = [r for r in caplog.records if "frobnicate_level" in r.getMessage()]
    assert [r.levelno for r in named] == [logging.WARNING, logging.DEBUG, logging.DEBUG, logging.DEBUG]
    assert "ChatCompletionRequest" in named[0].getMessage()
    assert named[0].__dict__["fields"]["ignored_fields"] == ["frobnicate_level"]


def test_a_refusing_server_answers_400_naming_the_unknown_field(refuse_server: LiveServer) -> None:
    client = _client(refuse_server)
    for call in (
        lambda: _chat(client, frobnicate_level=3),
        lambda: client.completions.create(
            model="standin", prompt="hi", max_tokens=2, extra_body={"frobnicate_level": 3}
        ),
    ):
        with pytest.raises(openai.BadRequestError) as caught:
            call()
        body: Any = caught.value.body
        assert body["param"] == "frobnicate_level"
        assert "frobnicate_level" in body["message"]
    assert _chat(client, metadata={"team": "a"}, store=False).choices  # accepted on purpose, either policy
    with pytest.raises(openai.BadRequestError) as caught:  # every endpoint, the Responses API included
        client.responses.create(model="standin", input="hi", extra_body={"frobnicate_level": 3})
    assert caught.value.body["param"] == "frobnicate_level"  # type: ignore[index]


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_openai_fields_the_server_does_not_implement_are_refused_by_name_under_either_policy(
    warn_server: LiveServer, name: str
) -> None:
    value: Any = {"audio": {"voice": "alloy", "format": "mp3"}, "modalities": ["text", "audio"]}.get(
        name, "x"
    )
    with pytest.raises(openai.BadRequestError) as caught:
        _chat(_client(warn_server), **{name: value})
    body: Any = caught.value.body
    assert body["param"] == name


def test_openai_fields_accepted_on_purpose_and_their_neutral_values_pass(
    warn_server: LiveServer, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="specdeploy_server.api.fields")
    sent = dict.fromkeys(ACCEPTED, "x") | {"modalities": ["text"], "audio": None}
    assert _chat(_client(warn_server), **sent).choices
    assert not [r for r in caplog.records if "ignored fields" in r.getMessage()]


# ------------------------------------------------------------------------------------------ health
def test_health_answers_with_ready_semantics(warn_server: LiveServer) -> None:
    response = httpx.get(f"{warn_server.base_url}/health")
    assert response.status_code == 200
    assert response.json() == httpx.get(f"{warn_server.base_url}/health/ready").json()
    state = app_state(warn_server.app)
    state.draining = True
    try:
        drained = httpx.get(f"{warn_server.base_url}/health")
        assert drained.status_code == 503
        assert drained.json() == {"status": "draining"}
    finally:
        state.draining = False


# ------------------------------------------------------------------------------------------ internal errors
def _exchange(sock: socket.socket, request: bytes) -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request and its response on an open socket (Content-Length bodies only)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}
    while len(body) < int(headers["content-length"]):
        chunk = sock.recv(65536)
        assert chunk, "the server closed the connection"
        body += chunk
    return int(status_line.split()[1]), headers, body


def _post(path: str, body: dict[str, Any]) -> bytes:
    payload = json.dumps(body).encode()
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload


def test_an_internal_error_is_a_json_500_and_the_connection_serves_the_next_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine, _ = standin_engine(0.0005, 0.0, alpha=0.7, settings=SETTINGS)
    app = create_app(engine)
    serving = app_state(app).serving

    async def broken(_: Any) -> Any:
        raise RuntimeError("injected failure")

    monkeypatch.setattr(serving, "completion", broken)
    request = {"model": "standin", "prompt": "hi", "max_tokens": 2}
    with run_live(app) as live:
        host, port = live.base_url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            status, headers, body = _exchange(sock, _post("/v1/completions", request))
            assert status == 500
            assert headers["content-type"] == "application/json"
            assert json.loads(body)["error"]["type"] == "server_error"
            status, _, body = _exchange(
                sock,
                _post("/v1/chat/completions", {**request, "messages": [{"role": "user", "content": "x"}]}),
            )
            assert status == 200, body
            assert json.loads(body)["object"] == "chat.completion"
            status, _, _ = _exchange(sock, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert status == 200
        with httpx.Client(base_url=live.base_url) as pooled:
            assert pooled.post("/v1/completions", json=request).status_code == 500
            assert pooled.get("/metrics").status_code == 200
            metrics = pooled.get("/metrics").text
        assert 'specdeploy_server_requests_total{code="500"' in metrics or '"500"' in metrics


# ------------------------------------------------------------------------------------------ contract
def test_an_integral_number_is_taken_for_an_integer_field(warn_server: LiveServer) -> None:
    base = warn_server.base_url
    body = {"model": "standin", "prompt": "hi", "max_tokens": 3.0, "n": 1.0, "seed": 7.0}
    response = httpx.post(f"{base}/v1/completions", json=body)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3
    for field, value in (("n", 1.5), ("n", True), ("max_tokens", "3")):
        refused = httpx.post(f"{base}/v1/completions", json={**body, field: value})
        assert refused.status_code == 400
        assert refused.json()["error"]["param"] == field


def test_the_document_names_the_served_model_for_every_request_body(warn_server: LiveServer) -> None:
    document = httpx.get(f"{warn_server.base_url}/openapi.json").json()
    schemas = document["components"]["schemas"]
    for name in ("CompletionRequest", "ChatCompletionRequest"):
        assert schemas[name]["properties"]["model"]["enum"] == ["standin"]
    assert "/health" in document["paths"]
