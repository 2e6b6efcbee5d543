"""The OpenAPI document tells the truth: schemathesis generates requests for every operation from the live
server's own document and every response passes all its checks; undocumented methods get 405 with `Allow`."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from schemathesis.core.failures import FailureGroup
from specdeploy_server.api.app import create_app
from specdeploy_server.api.sampling import unsigned_seed
from specdeploy_server.backends.standin import standin_engine
from specdeploy_server.core.scheduler import SchedulerSettings

from benchmarks.reliability.fuzz import fuzz, unsupported_methods
from tests.server.conftest import LiveServer, run_live

GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    settings = SchedulerSettings(max_model_len=128, max_batch_size=4, max_queue_size=8, draft_len=3)
    engine, _ = standin_engine(0.0005, 0.0, alpha=0.7, settings=settings)
    with run_live(create_app(engine)) as live:
        yield live


@pytest.fixture(scope="module")
def document(server: LiveServer) -> dict[str, Any]:
    document: dict[str, Any] = httpx.get(f"{server.base_url}/openapi.json").json()
    return document


def test_every_operation_answers_as_the_document_says_under_fuzzing(server: LiveServer) -> None:
    tally = fuzz(server.base_url, "standin", examples_per_operation=25)
    assert tally.failures == {}, "\n\n".join(tally.examples)
    assert tally.server_errors == 0
    # 7, /health beside /health/live and /health/ready, and the Responses API's create, retrieve and delete
    assert tally.figures()["operations"] == 11
    assert tally.modes["negative"] > 0
    for path in GENERATION_PATHS:  # valid model names reach generation
        assert tally.statuses[f"POST {path} 200"] > 0, tally.statuses
    assert httpx.get(f"{server.base_url}/health/ready").status_code == 200


def test_undocumented_methods_get_405_naming_the_allowed_ones_and_unknown_routes_404(
    server: LiveServer,
) -> None:
    requests, problems = unsupported_methods(server.base_url)
    assert problems == []
    assert requests >= 20
    response = httpx.delete(f"{server.base_url}/v1/completions")
    assert response.headers["allow"] == "POST"
    assert response.json()["error"]["code"] == "method_not_allowed"


def test_the_document_declares_every_error_status_streams_and_prometheus_text(
    document: dict[str, Any],
) -> None:
    paths = document["paths"]
    for path in GENERATION_PATHS:
        responses = paths[path]["post"]["responses"]
        assert set(responses) == {"200", "400", "401", "404", "413", "500", "503"}
        assert set(responses["200"]["content"]) == {"application/json", "text/event-stream"}
        for status in ("400", "401", "404", "413", "500", "503"):
            schema = responses[status]["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/ErrorResponse"}
        assert "Retry-After" in responses["503"]["headers"]
    assert set(paths["/metrics"]["get"]["responses"]["200"]["content"]) == {"text/plain"}
    assert not [p for p, ops in paths.items() for op in ops.values() if "422" in op["responses"]]
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_a_stream_event_that_breaks_the_document_fails_the_check(
    server: LiveServer, document: dict[str, Any]
) -> None:
    """The checks can fail: the same stream against a document that expects another chunk type."""
    document = copy.deepcopy(document)
    chunk = document["components"]["schemas"]["ChatCompletionChunk"]["properties"]["object"]
    chunk["const"] = "chat.completion.other"
    schema = schemathesis.openapi.from_dict(document)
    case = schema["/v1/chat/completions"]["POST"].Case(
        body={"model": "standin", "messages": [{"role": "user", "content": "hi"}], "stream": True},
        media_type="application/json",
    )
    response = case.call(base_url=server.base_url)
    assert response.status_code == 200
    with pytest.raises(FailureGroup, match="SSE event violates schema"):
        case.validate_response(response)


def test_any_integer_seed_is_taken_as_an_unsigned_64_bit_one(server: LiveServer) -> None:
    """Found by the fuzzer: a negative seed failed the request with 500."""
    for seed in (-1, -(2**63), 2**70):
        body = {"model": "standin", "prompt": "hi", "max_tokens": 8, "temperature": 1.0, "seed": seed}
        response = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60)
        assert response.status_code == 200, response.text
    assert [unsigned_seed(s) for s in (0, 5, 2**64 - 1, -1, 2**64 + 3)] == [0, 5, 2**64 - 1, 2**64 - 1, 3]
