"""Backend trtllm-llmapi through the TensorRT-LLM test double, with the official openai client: structured
output (TensorRT-LLM's guided decoding, llguidance backend), penalties, top_k and min_p reach TensorRT-LLM's
SamplingParams and change what it emits, with speculation on (draft-target, prompt lookup) and off; what the
backend does not pass on is refused with a 400 naming the field and the backend."""

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
from tests.server.plain_decoding import Penalties, PlainDecoder
from tests.server.trtllm_double import DoubleState, trtllm_double

__all__ = ["trtllm_double"]

METHODS = ["draftTarget", "promptLookup", "none"]


def _config(models: TinyModels, method: str) -> dict[str, Any]:
    model: dict[str, Any] = {"target": str(models.target)}
    if method == "draftTarget":
        model["draft"] = str(models.draft_unrelated)
    speculative = {"method": method, "draftLen": 4} if method != "none" else {"method": "none"}
    return {"model": model, "backend": "trtllm-llmapi", "speculative": speculative}


@pytest.fixture(params=METHODS)
def served(
    request: pytest.FixtureRequest, tiny_models: TinyModels, trtllm_double: DoubleState
) -> Iterator[tuple[LiveServer, DoubleState]]:
    config = ServerConfig.model_validate(_config(tiny_models, request.param))
    with run_live(create_app(build_engine(config), served_model_name="tiny")) as live:
        yield live, trtllm_double


def _client(live: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_json_schema_outputs_validate_and_equal_plain_constrained_greedy_decoding(
    served: tuple[LiveServer, DoubleState], plain_outputs: list[str]
) -> None:
    live, double = served
    client = _client(live)
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
    (llm,) = double.llms
    assert llm.kwargs["guided_decoding_backend"] == "llguidance"
    guide = llm.requests[-1].params.guided_decoding
    assert guide is not None
    assert isinstance(guide.json, str)
    assert json.loads(guide.json)["x-guidance"] == {"whitespace_flexible": False}
    if llm.spec is not None:
        assert sum(r.drafted for r in llm.requests) > 0  # TensorRT-LLM speculated under the grammar


def test_sampled_json_schema_outputs_json_object_lark_and_tool_calls_follow_their_grammar(
    served: tuple[LiveServer, DoubleState],
) -> None:
    client = _client(served[0])
    for i, schema in enumerate(SCHEMAS[:8]):
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
    obj = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(obj.choices[0].message.content or ""), dict)
    grammar = 'start: ("yes" | "no") " " NUM\nNUM: /[0-9]{1,3}/'
    for seed in range(3):
        text = (
            client.completions.create(
                model="tiny",
                prompt="is it",
                max_tokens=20,
                temperature=1.0,
                seed=seed,
                extra_body={"response_format": {"type": "lark_grammar", "lark_grammar": grammar}},
            )
            .choices[0]
            .text
        )
        word, number = text.split(" ")
        assert word in ("yes", "no")
        assert number.isdigit()
    weather = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 12}, "days": {"type": "integer"}},
        "required": ["city", "days"],
        "additionalProperties": False,
    }
    call = client.chat.completions.create(
        model="tiny",
        messages=MESSAGES,
        max_tokens=MAX_TOKENS,
        temperature=0,
        tools=[{"type": "function", "function": {"name": "weather", "parameters": weather}}],
        tool_choice="required",
    )
    (tool_call,) = call.choices[0].message.tool_calls or []
    assert tool_call.type == "function"
    assert tool_call.function.name == "weather"
    jsonschema.validate(json.loads(tool_call.function.arguments), weather)


def test_penalties_change_the_output_exactly_as_plain_penalised_greedy_decoding(
    served: tuple[LiveServer, DoubleState], plain: PlainDecoder
) -> None:
    client = _client(served[0])
    prompt = plain.tokenizer(
        "the draft model proposes tokens and the target", add_special_tokens=True
    ).input_ids
    penalties = Penalties(presence=1.5, frequency=0.5, repetition=1.3)
    unpenalised = plain.greedy(prompt, 24)
    expected = plain.greedy(prompt, 24, penalties)
    assert expected != unpenalised
    result = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=24,
        temperature=0,
        presence_penalty=1.5,
        frequency_penalty=0.5,
        extra_body={"repetition_penalty": 1.3},
    )
    assert result.choices[0].text == plain.tokenizer.decode(expected, skip_special_tokens=True)


def test_top_k_and_min_p_reach_tensorrt_llm_and_filter_what_it_samples(
    served: tuple[LiveServer, DoubleState],
) -> None:
    live, double = served
    client = _client(live)
    texts = {
        client.completions.create(
            model="tiny",
            prompt="draft target",
            max_tokens=6,
            temperature=1.0,
            seed=seed,
            extra_body={"top_k": 1},
        )
        .choices[0]
        .text
        for seed in range(4)
    }
    assert len(texts) == 1  # top_k 1 keeps only the argmax, whatever the seed
    client.completions.create(
        model="tiny", prompt="draft target", max_tokens=4, temperature=1.0, extra_body={"min_p": 0.2}
    )
    params = double.llms[0].requests[-1].params
    assert (params.min_p, params.top_k) == (0.2, None)


def test_a_raw_llguidance_grammar_is_refused_naming_field_and_backend(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    """TensorRT-LLM's GuidedDecodingParams take JSON, regex, EBNF/Lark and structural tags, not llguidance's
    own grammar format."""
    config = ServerConfig.model_validate(_config(tiny_models, "promptLookup"))
    grammar = {"grammars": [{"lark_grammar": "start: /a+/"}]}
    body = {"response_format": {"type": "llguidance", "grammar": grammar}}
    with (
        run_live(create_app(build_engine(config), served_model_name="tiny")) as live,
        pytest.raises(openai.BadRequestError) as refused,
    ):
        _client(live).completions.create(model="tiny", prompt="draft target", max_tokens=4, extra_body=body)
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["param"] == "response_format"
    assert "backend (trtllm-llmapi)" in error["message"]
    assert trtllm_double.llms[0].requests == []
