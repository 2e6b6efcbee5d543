"""Structured output through the official openai client, with speculation on (draft model, prompt lookup)
and off: every output follows its schema, and greedy constrained output is plain constrained greedy output."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import openai
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig

from tests.server.conftest import LiveServer, TinyModels, run_live
from tests.server.constrained_cases import (
    MAX_TOKENS,
    MESSAGES,
    SCHEMAS,
    json_schema_format,
)

METHODS = ["draftTarget", "promptLookup", "none"]


def _config(models: TinyModels, method: str) -> dict[str, Any]:
    model: dict[str, Any] = {"target": str(models.target), "servedModelName": "tiny"}
    if method == "draftTarget":
        model["draft"] = str(models.draft_unrelated)
    speculative = {"method": method, "draftLen": 4} if method != "none" else {"method": "none"}
    return {"model": model, "speculative": speculative, "placement": {"device": "cpu"}}


@pytest.fixture(scope="module", params=METHODS)
def server(request: pytest.FixtureRequest, tiny_models: TinyModels) -> Iterator[LiveServer]:
    config = ServerConfig.model_validate(_config(tiny_models, request.param))
    with run_live(create_app(build_engine(config), served_model_name="tiny")) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_every_greedy_output_validates_and_equals_plain_constrained_greedy_decoding(
    client: openai.OpenAI, plain_outputs: list[str]
) -> None:
    drafted = accepted = forced = 0
    for schema, expected in zip(SCHEMAS, plain_outputs, strict=True):
        result = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=MAX_TOKENS,
            temperature=0,
            response_format=json_schema_format(schema),
        )
        choice = result.choices[0]
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        content = choice.message.content or ""
        jsonschema.validate(json.loads(content), schema)
        assert content == expected
        stats = (result.model_extra or {})["speculative"]
        drafted += stats["draft_tokens"]
        accepted += stats["accepted_draft_tokens"]
        forced += stats["forced_tokens"]
    assert forced > 0  # separators, keys and closing brackets cost no model step
    assert accepted <= drafted


def test_sampled_outputs_validate_too(client: openai.OpenAI) -> None:
    for i, schema in enumerate(SCHEMAS[:20]):
        result = client.chat.completions.create(
            model="tiny",
            messages=MESSAGES,
            max_tokens=MAX_TOKENS,
            temperature=1.0,
            seed=i,
            n=2,
            response_format=json_schema_format(schema),
        )
        for choice in result.choices:
            assert choice.finish_reason == "stop"
            jsonschema.validate(json.loads(choice.message.content or ""), schema)


def test_json_object_mode_returns_a_json_object(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert result.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(result.choices[0].message.content or ""), dict)


def test_a_lark_grammar_constrains_a_completion(client: openai.OpenAI) -> None:
    grammar = 'start: ("yes" | "no") " " NUM\nNUM: /[0-9]{1,3}/'
    for seed in range(5):
        result = client.completions.create(
            model="tiny",
            prompt="is it",
            max_tokens=20,
            temperature=1.0,
            seed=seed,
            extra_body={"response_format": {"type": "lark_grammar", "lark_grammar": grammar}},
        )
        word, number = result.choices[0].text.split(" ")
        assert word in ("yes", "no")
        assert number.isdigit()
        assert len(number) <= 3
