"""A server with a served model name and aliases: every name is accepted and listed, answers carry the served
name, metrics count under it, and an unknown name is a 404 that lists them all."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.standin import standin_engine
from specdeploy_server.core.scheduler import SchedulerSettings

from tests.server.conftest import LiveServer, run_live

NAME = "meta-llama/Llama-3.1-8B-Instruct"
ALIASES = ("Llama-3.1-8B-Instruct", "llama")


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    engine, _ = standin_engine(0.001, 0.0, alpha=0.7, settings=SchedulerSettings(max_model_len=256))
    with run_live(create_app(engine, served_model_name=NAME, served_model_aliases=ALIASES)) as live:
        yield live


@pytest.fixture
def http(server: LiveServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=30) as client:
        yield client


def test_the_model_list_has_the_served_name_first_and_then_each_alias(http: httpx.Client) -> None:
    listed = http.get("/v1/models").json()["data"]
    assert [card["id"] for card in listed] == [NAME, *ALIASES]
    for name in (NAME, *ALIASES):
        assert http.get(f"/v1/models/{name}").json()["id"] == name


@pytest.mark.parametrize("sent", [NAME, *ALIASES])
def test_a_request_under_any_name_is_answered_under_the_served_name(http: httpx.Client, sent: str) -> None:
    completion = http.post("/v1/completions", json={"model": sent, "prompt": "hello", "max_tokens": 3})
    assert completion.status_code == 200, completion.text
    assert completion.json()["model"] == NAME
    chat = http.post(
        "/v1/chat/completions",
        json={"model": sent, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3},
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["model"] == NAME
    answer = http.post("/v1/responses", json={"model": sent, "input": "hi", "max_output_tokens": 3})
    assert answer.status_code == 200, answer.text
    assert answer.json()["model"] == NAME


def test_an_unknown_name_is_a_404_listing_the_served_names(http: httpx.Client) -> None:
    for response in (
        http.post("/v1/completions", json={"model": "target", "prompt": "hello"}),
        http.get("/v1/models/target"),
    ):
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert error["code"] == "model_not_found"
        assert error["param"] == "model"
        assert error["message"] == (
            "The model 'target' does not exist; this server serves "
            "'meta-llama/Llama-3.1-8B-Instruct', 'Llama-3.1-8B-Instruct', 'llama'"
        )


def test_metrics_count_every_name_under_the_served_one(http: httpx.Client) -> None:
    http.post("/v1/completions", json={"model": "llama", "prompt": "hello", "max_tokens": 2})
    text = http.get("/metrics").text
    labelled = [line for line in text.splitlines() if 'model="' in line]
    assert labelled
    assert all(f'model="{NAME}"' in line for line in labelled)


def test_the_openapi_document_offers_every_name(http: httpx.Client) -> None:
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    assert schemas["CompletionRequest"]["properties"]["model"]["enum"] == [NAME, *ALIASES]
