"""HTTP behaviour over a real uvicorn server with stand-in executors: errors, limits, health, metrics,
disconnects and shutdown."""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator

import httpx
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.standin import StandInTarget, standin_engine
from specdeploy_server.core.scheduler import SchedulerSettings
from specdeploy_server.engine import Engine

from tests.conftest import wait_for
from tests.server.conftest import LiveServer, run_live

KEY = "sk-test-123"


def _app(
    settings: SchedulerSettings, verify_seconds: float = 0.001, api_key: str | None = None
) -> tuple[object, Engine, StandInTarget]:
    engine, target = standin_engine(verify_seconds, 0.0, alpha=0.7, settings=settings)
    return create_app(engine, api_key=api_key), engine, target


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    app, _, _ = _app(SchedulerSettings(max_model_len=64, draft_len=3))
    with run_live(app) as live:
        yield live


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=10) as client:
        yield client


def _completion(**overrides: object) -> dict[str, object]:
    return {"model": "standin", "prompt": "hello", "max_tokens": 5, **overrides}


def _assert_error(response: httpx.Response, status: int, contains: str, param: str | None = None) -> None:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert contains in error["message"]
    if param is not None:
        assert error["param"] == param


def test_a_valid_completion_succeeds(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json=_completion())
    assert response.status_code == 200
    body = response.json()
    assert body["usage"]["completion_tokens"] == 5
    assert body["choices"][0]["finish_reason"] == "length"


def test_malformed_json_is_a_bad_request(http: httpx.Client) -> None:
    response = http.post(
        "/v1/completions",
        content=b'{"model": "standin", "prompt": ',
        headers={"content-type": "application/json"},
    )
    _assert_error(response, 400, "not valid JSON")
    assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_tokens", "lots"),
        ("temperature", "hot"),
        ("stream", "maybe"),
        ("prompt", 42),
        ("stop", 3),
        # strict JSON types (found by the fuzzer): no boolean for a number, no number for a boolean
        ("frequency_penalty", False),
        ("echo", 0.0),
        ("seed", "7"),
        ("max_tokens", 5.5),  # 5.0 is an integer (JSON Schema), 5.5 is not
    ],
)
def test_a_wrong_type_is_a_bad_request_naming_the_field(
    http: httpx.Client, field: str, value: object
) -> None:
    _assert_error(http.post("/v1/completions", json=_completion(**{field: value})), 400, field, param=field)


def test_a_missing_required_field_is_a_bad_request(http: httpx.Client) -> None:
    _assert_error(http.post("/v1/completions", json={"model": "standin"}), 400, "prompt", param="prompt")
    _assert_error(http.post("/v1/chat/completions", json={"model": "standin"}), 400, "messages")


@pytest.mark.parametrize("max_tokens", [0, -3])
def test_non_positive_max_tokens_is_a_bad_request(http: httpx.Client, max_tokens: int) -> None:
    response = http.post("/v1/completions", json=_completion(max_tokens=max_tokens))
    _assert_error(response, 400, "max_tokens must be at least 1", param="max_tokens")


def test_a_prompt_longer_than_the_context_is_a_bad_request(http: httpx.Client) -> None:
    response = http.post("/v1/completions", json=_completion(prompt="x" * 100))
    _assert_error(response, 400, "maximum context length is 64 tokens")
    assert response.json()["error"]["code"] == "context_length_exceeded"
    too_many = http.post("/v1/completions", json=_completion(prompt="x" * 40, max_tokens=30))
    _assert_error(too_many, 400, "you requested 70 tokens", param="max_tokens")


@pytest.mark.parametrize("limit", [{}, {"max_tokens": 4}, {"max_completion_tokens": 4}])
def test_a_chat_longer_than_the_context_names_the_messages(http: httpx.Client, limit: dict[str, int]) -> None:
    body = {"model": "standin", "messages": [{"role": "user", "content": "x" * 100}], **limit}
    response = http.post("/v1/chat/completions", json=body)
    _assert_error(response, 400, "maximum context length is 64 tokens", param="messages")


def test_the_served_model_can_be_retrieved_by_its_id(http: httpx.Client) -> None:
    listed = http.get("/v1/models").json()["data"]
    assert http.get("/v1/models/standin").json() == listed[0]
    response = http.get("/v1/models/other")
    _assert_error(response, 404, "'other' does not exist", param="model")
    assert response.json()["error"]["code"] == "model_not_found"


def test_an_empty_prompt_is_a_bad_request(http: httpx.Client) -> None:
    _assert_error(http.post("/v1/completions", json=_completion(prompt="")), 400, "empty", param="prompt")


@pytest.mark.parametrize(("field", "value"), [("best_of", 3), ("suffix", "x")])
def test_unsupported_options_are_refused(http: httpx.Client, field: str, value: object) -> None:
    response = http.post("/v1/completions", json=_completion(**{field: value}))
    _assert_error(response, 400, "not supported", param=field)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("logit_bias", {"5": 1.0}),
        ("presence_penalty", 0.5),
        ("frequency_penalty", 0.5),
        ("repetition_penalty", 1.2),
        ("top_k", 5),
        ("min_p", 0.1),
        ("logprobs", 2),
        ("response_format", {"type": "json_object"}),
    ],
)
def test_options_the_backend_cannot_apply_are_refused_naming_the_field_and_backend(
    http: httpx.Client, field: str, value: object
) -> None:
    response = http.post("/v1/completions", json=_completion(**{field: value}))
    _assert_error(response, 400, "not supported by this server's backend (standin)", param=field)


def test_n_choices_and_echo_work_on_any_backend(http: httpx.Client) -> None:
    body = http.post("/v1/completions", json=_completion(n=3, echo=True)).json()
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert all(c["text"].startswith("hello") for c in body["choices"])
    assert body["usage"]["completion_tokens"] == 15


def test_an_unknown_model_is_not_found(http: httpx.Client) -> None:
    response = http.post(
        "/v1/chat/completions", json={"model": "nope", "messages": [{"role": "user", "content": "hi"}]}
    )
    _assert_error(response, 404, "'nope' does not exist", param="model")
    assert response.json()["error"]["code"] == "model_not_found"


def test_an_unknown_route_is_not_found_in_the_openai_shape(http: httpx.Client) -> None:
    _assert_error(http.get("/v1/embeddings"), 404, "no such endpoint")


def test_the_stream_ends_with_done_and_carries_usage_in_the_final_chunk(http: httpx.Client) -> None:
    with http.stream("POST", "/v1/completions", json=_completion(stream=True, max_tokens=9)) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line[len("data: ") :] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len("".join(c["choices"][0]["text"] for c in chunks)) == 9  # one character per token
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 9
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_health_and_metrics(http: httpx.Client) -> None:
    assert http.get("/health/live").status_code == 200
    assert http.get("/health/ready").status_code == 200
    http.post("/v1/completions", json=_completion())
    text = http.get("/metrics").text
    for name in (
        "specdeploy_requests_total",
        "specdeploy_request_errors_total",
        "specdeploy_requests_in_flight",
        "specdeploy_queue_depth",
        "specdeploy_queue_seconds",
        "specdeploy_prompt_tokens_total",
        "specdeploy_generation_tokens_total",
        "specdeploy_time_to_first_token_seconds_bucket",
        "specdeploy_inter_token_latency_seconds_bucket",
        "specdeploy_e2e_request_latency_seconds_bucket",
        "specdeploy_draft_tokens_total",
        "specdeploy_accepted_draft_tokens_total",
        "specdeploy_accepted_length_bucket",
    ):
        assert name in text, name
    assert 'specdeploy_requests_total{endpoint="/v1/completions",model="standin",status="200"}' in text


def test_a_burst_of_malformed_requests_leaves_the_server_healthy(
    http: httpx.Client, server: LiveServer
) -> None:
    bodies: list[bytes] = [
        b"{",
        b"[]",
        b"null",
        b'{"model": 1}',
        b'{"prompt": []}',
        b"\xff\xfe",
        b'{"max_tokens": {}}',
    ]

    def fire(i: int) -> int:
        with httpx.Client(base_url=server.base_url, timeout=10) as c:
            body = bodies[i % len(bodies)]
            return c.post(
                "/v1/completions", content=body, headers={"content-type": "application/json"}
            ).status_code

    with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
        statuses = list(pool.map(fire, range(300)))
    assert set(statuses) == {400}
    assert http.get("/health/ready").status_code == 200
    assert http.post("/v1/completions", json=_completion()).status_code == 200


def test_the_api_key_is_required_when_configured() -> None:
    app, _, _ = _app(SchedulerSettings(), api_key=KEY)
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=10) as http:
        _assert_error(http.post("/v1/completions", json=_completion()), 401, "API key")
        wrong = http.post("/v1/completions", json=_completion(), headers={"Authorization": "Bearer nope"})
        _assert_error(wrong, 401, "API key")
        assert wrong.json()["error"]["code"] == "invalid_api_key"
        _assert_error(http.get("/v1/models"), 401, "API key")
        ok = http.post("/v1/completions", json=_completion(), headers={"Authorization": f"Bearer {KEY}"})
        assert ok.status_code == 200
        assert http.get("/health/ready").status_code == 200  # probes need no key
        assert http.get("/metrics").status_code == 200


def test_a_full_queue_answers_503_with_retry_after() -> None:
    """maxQueueSize 1 on one batch slot: one request runs, one waits, the next is refused."""
    app, engine, _ = _app(
        SchedulerSettings(max_batch_size=1, max_queue_size=1, draft_len=0), verify_seconds=0.01
    )
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=10) as http:
        with (
            http.stream("POST", "/v1/completions", json=_completion(stream=True, max_tokens=1000)) as first,
            http.stream("POST", "/v1/completions", json=_completion(stream=True, max_tokens=5)) as second,
        ):
            lines = first.iter_lines()  # kept: dropping the iterator would close the stream
            next(lines)
            wait_for(lambda: engine.queue_depth == 2, timeout=30, interval=0.02, what="both requests taken")
            busy = http.post("/v1/completions", json=_completion())
            _assert_error(busy, 503, "queue is full")
            assert busy.headers["retry-after"] == "1"
            del second
        wait_for(lambda: engine.queue_depth == 0, timeout=30, interval=0.02, what="the queue empty")
        assert http.post("/v1/completions", json=_completion()).status_code == 200


def test_a_client_disconnecting_mid_stream_cancels_its_generation() -> None:
    app, engine, target = _app(SchedulerSettings(draft_len=2), verify_seconds=0.005)
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=10) as http:
        with http.stream(
            "POST", "/v1/completions", json=_completion(stream=True, max_tokens=4000)
        ) as response:
            lines = response.iter_lines()
            next(lines)
            next(lines)
            assert engine.queue_depth == 1
        wait_for(lambda: engine.queue_depth == 0, timeout=30, interval=0.02, what="the queue empty")
        # released between steps, once the step in flight has returned
        wait_for(
            lambda: len(target.released) == 1, timeout=30, interval=0.02, what="1 released by the target"
        )
        calls = target.calls
        time.sleep(0.1)
        assert target.calls == calls  # no step runs for it any more


def test_n_choices_that_do_not_all_fit_the_queue_are_refused_whole() -> None:
    app, engine, _ = _app(SchedulerSettings(max_batch_size=1, max_queue_size=1, draft_len=0))
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=10) as http:
        _assert_error(http.post("/v1/completions", json=_completion(n=3)), 503, "queue is full")
        wait_for(lambda: engine.queue_depth == 0, timeout=30, interval=0.02, what="the queue empty")
        assert http.post("/v1/completions", json=_completion(n=2)).status_code == 200


def test_a_client_disconnecting_from_an_n_choice_stream_cancels_every_choice() -> None:
    app, engine, target = _app(SchedulerSettings(draft_len=2), verify_seconds=0.005)
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=10) as http:
        with http.stream(
            "POST", "/v1/completions", json=_completion(stream=True, max_tokens=4000, n=3)
        ) as response:
            lines = response.iter_lines()
            next(lines)
            next(lines)
            assert engine.queue_depth == 3
        wait_for(lambda: engine.queue_depth == 0, timeout=30, interval=0.02, what="the queue empty")
        wait_for(
            lambda: len(target.released) == 3, timeout=30, interval=0.02, what="3 released by the target"
        )


def test_a_client_disconnecting_from_an_n_choice_request_cancels_every_choice() -> None:
    app, engine, target = _app(SchedulerSettings(draft_len=2), verify_seconds=0.005)
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=0.3) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/completions", json=_completion(max_tokens=4000, n=2))
        wait_for(lambda: engine.queue_depth == 0, timeout=30, interval=0.02, what="the queue empty")
        wait_for(
            lambda: len(target.released) == 2, timeout=30, interval=0.02, what="2 released by the target"
        )


def test_a_client_disconnecting_while_waiting_for_a_non_streamed_answer_cancels_it() -> None:
    app, engine, target = _app(SchedulerSettings(draft_len=2), verify_seconds=0.005)
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=0.3) as http:
        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/completions", json=_completion(max_tokens=4000))
        wait_for(lambda: engine.queue_depth == 0, timeout=30, interval=0.02, what="the queue empty")
        # released between steps, once the step in flight has returned
        wait_for(
            lambda: len(target.released) == 1, timeout=30, interval=0.02, what="1 released by the target"
        )


def test_shutdown_lets_in_flight_streams_finish_and_refuses_new_connections() -> None:
    app, _, _ = _app(SchedulerSettings(draft_len=0), verify_seconds=0.01)
    with run_live(app) as live:
        with (
            httpx.Client(base_url=live.base_url, timeout=10) as http,
            http.stream("POST", "/v1/completions", json=_completion(stream=True, max_tokens=40)) as response,
        ):
            lines = response.iter_lines()
            next(lines)
            live.server.should_exit = True  # what SIGTERM does
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][len("data: ") :])["choices"][0]["finish_reason"] == "length"
        live.thread.join(timeout=10)
        assert not live.thread.is_alive()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{live.base_url}/health/live", timeout=2)
