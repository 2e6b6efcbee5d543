"""Objects are closed: a schema that declares ``properties`` and says nothing of ``additionalProperties``
allows no other key (vLLM's default grammar backend does the same), ``strict: true`` allows none anywhere,
and a schema that opens an object on purpose keeps it open."""

from __future__ import annotations

from typing import Any

import pytest
from specdeploy_server.api.errors import BadRequestError
from specdeploy_server.api.protocol import ChatCompletionRequest
from specdeploy_server.api.structured import closed_schema, requested_guide
from specdeploy_server.grammar import GrammarCompiler
from specdeploy_server.tokenizer import HFTokenizer

from tests.server.conftest import TinyModels

PERSON: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "pet": {"type": "object", "properties": {"kind": {}}}},
    "required": ["name"],
}


@pytest.fixture(scope="module")
def compiler(tiny_models: TinyModels) -> tuple[GrammarCompiler, Any]:
    tokenizer = HFTokenizer(tiny_models.target)
    return GrammarCompiler(tokenizer.hf, len(tokenizer.hf), tokenizer.eos_token_ids), tokenizer.hf


def _request(response_format: dict[str, Any]) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate(
        {"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": response_format}
    )


def _allows(compiler: tuple[GrammarCompiler, Any], response_format: dict[str, Any], text: str) -> bool:
    grammars, hf = compiler
    guide = requested_guide(_request(response_format))
    assert guide is not None
    constraint = grammars.compile(guide.grammar(), guide)
    tokens = hf.encode(text, add_special_tokens=False)
    return constraint.allowed_prefix(tokens) == len(tokens)


def _format(schema: dict[str, Any], strict: bool | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "person", "schema": schema}
    if strict is not None:
        spec["strict"] = strict
    return {"type": "json_schema", "json_schema": spec}


@pytest.mark.parametrize("strict", [None, False, True])
def test_an_object_that_says_nothing_of_additional_properties_takes_no_other_key(
    compiler: tuple[GrammarCompiler, Any], strict: bool | None
) -> None:
    assert _allows(compiler, _format(PERSON, strict), '{"name":"a","pet":{"kind":1}}')
    assert not _allows(compiler, _format(PERSON, strict), '{"name":"a","age":3}')
    assert not _allows(compiler, _format(PERSON, strict), '{"name":"a","pet":{"kind":1,"legs":4}}')


def test_an_object_opened_on_purpose_stays_open_unless_strict(compiler: tuple[GrammarCompiler, Any]) -> None:
    opened = {**PERSON, "additionalProperties": True}
    assert _allows(compiler, _format(opened), '{"name":"a","age":3}')
    with pytest.raises(BadRequestError) as caught:
        requested_guide(_request(_format(opened, strict=True)))
    assert caught.value.param == "response_format"


def test_a_free_form_object_stays_open(compiler: tuple[GrammarCompiler, Any]) -> None:
    assert _allows(compiler, {"type": "json_object"}, '{"anything":1}')
    assert _allows(compiler, _format({"type": "object"}), '{"anything":1}')


def test_closing_leaves_the_schema_it_was_given_as_it_was() -> None:
    closed = closed_schema(PERSON, strict=False, param="tools")
    assert "additionalProperties" not in PERSON
    assert closed["additionalProperties"] is False
    assert closed["properties"]["pet"]["additionalProperties"] is False
    assert "additionalProperties" not in closed["properties"]["pet"]["properties"]["kind"]
