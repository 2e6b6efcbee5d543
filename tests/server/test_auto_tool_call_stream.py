"""``tool_choice: auto`` streamed: content as it comes, a call's arguments as they are generated, through the
stream parser (every split of the text) and through the openai client against a live server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import openai
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.api.autocall import AutoCallStream
from specdeploy_server.api.structured import auto_tool_calls
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_testkit import checkpoints
from specdeploy_testkit.checkpoints import TinyLlama

from tests.server.conftest import LiveServer, TinyModels, run_live
from tests.server.test_tool_choice_auto import NAMES, TOOLS_TEMPLATE, WEATHER


def _streamed(text: str, pieces: list[str]) -> tuple[str, list[dict[str, str]], int, int]:
    """Feed ``pieces`` (which make ``text``); the content, the calls assembled from their deltas as a client
    does, and the stream's call counts."""
    assert "".join(pieces) == text
    stream = AutoCallStream(NAMES)
    content = ""
    calls: list[dict[str, str]] = []
    for i, piece in enumerate(pieces):
        found = stream.feed(piece, finished=i == len(pieces) - 1)
        content += found.content
        for delta in found.calls:
            if delta.id is not None:
                assert delta.index == len(calls)
                assert delta.function.name is not None
                calls.append({"id": delta.id, "name": delta.function.name, "arguments": ""})
            calls[delta.index]["arguments"] += delta.function.arguments or ""
    return content, calls, stream.calls, stream.complete_calls


def _chars(text: str) -> list[str]:
    return list(text)


def _halves(text: str) -> list[str]:
    return [text[: len(text) // 2], text[len(text) // 2 :]]


WELL_FORMED = [
    'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>',
    '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo", "days": [1, {"a": {}}]}}</tool_call>'
    '\n<tool_call>{"name": "get_time", "arguments": {}}</tool_call>',
    ' {"name": "get_time", "parameters": {"tz": "UTC"}}',
    '{"name":"get_weather","arguments":{"city":"Tromsø"}}  ',
    '{"name": "get_time", "parameters": {"tz": "UTC"} }',  # whitespace before the object's closing brace
    '<tool_call>\n{"name": "get_time",\n "arguments": {"tz": "UTC"}\n}\n</tool_call>',
]


@pytest.mark.parametrize("text", WELL_FORMED)
@pytest.mark.parametrize("split", [_chars, _halves, lambda t: [t]])
def test_streamed_calls_and_content_equal_the_non_streamed_answer(text: str, split: Any) -> None:
    content, calls, sent, complete = _streamed(text, split(text))
    found = auto_tool_calls(text, NAMES)
    assert found is not None
    expected_content, expected_calls = found
    assert content == (expected_content or "")
    assert [c["name"] for c in calls] == [c["function"]["name"] for c in expected_calls]
    for call, expected in zip(calls, expected_calls, strict=True):
        assert call["arguments"] == expected["function"]["arguments"]  # the text generated, not re-serialised
    assert sent == complete == len(expected_calls)


def test_arguments_arrive_in_several_fragments_before_the_call_closes() -> None:
    text = WELL_FORMED[0]
    stream = AutoCallStream(NAMES)
    fragments: list[str] = []
    for i, char in enumerate(text):
        found = stream.feed(char, finished=i == len(text) - 1)
        fragments += [d.function.arguments for d in found.calls if d.function.arguments]
        if i == text.index('"Oslo"') + 3:  # mid-way through the arguments: some went out already
            assert "".join(fragments) == '{"city": "Osl'
    assert "".join(fragments) == '{"city": "Oslo"}'
    assert len(fragments) > 5


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny. <tool time> 3 < 4",
        '{"city": "Oslo"}',
        '{"name": "unknown_tool", "arguments": {}}',
        'Here: <tool_call>{"name": "unknown_tool", "arguments": {}}</tool_call>',
    ],
)
@pytest.mark.parametrize("split", [_chars, _halves])
def test_text_that_holds_no_call_streams_as_the_same_content(text: str, split: Any) -> None:
    content, calls, _, _ = _streamed(text, split(text))
    assert auto_tool_calls(text, NAMES) is None
    assert calls == []
    assert content == text


def test_a_block_with_its_arguments_first_is_sent_whole_once_closed() -> None:
    text = '<tool_call>{"arguments": {"city": "Oslo"}, "name": "get_weather"}</tool_call>'
    content, calls, sent, complete = _streamed(text, _chars(text))
    assert content == ""
    assert [(c["name"], json.loads(c["arguments"])) for c in calls] == [("get_weather", {"city": "Oslo"})]
    assert sent == complete == 1


def test_a_call_cut_short_is_sent_with_what_was_generated_and_is_not_complete() -> None:
    text = 'ok <tool_call>{"name": "get_weather", "arguments": {"city": "Os'
    content, calls, sent, complete = _streamed(text, _chars(text))
    assert content == "ok"
    assert calls[0]["arguments"] == '{"city": "Os'
    assert (sent, complete) == (1, 0)


# The random test model follows a grammar: under tool_choice auto, the answer is a sentence, then a call whose
# arguments the model writes itself (free lowercase words).
CALL_GRAMMAR = (
    r'start: "Checking the weather.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": '
    r'{\"city\": \"" WORD "\", \"unit\": \"" WORD "\", \"note\": \"" WORD "\"}}\n</tool_call>"'
    "\nWORD: /[a-z]{3,12}/\n"
)


@pytest.fixture(scope="module")
def server(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    # the tools in the prompt and the call in the answer need more than the shared models' context
    root = Path(tmp_path_factory.mktemp("tools"))
    long = TinyLlama(max_position_embeddings=1024)
    target = checkpoints.save_tiny_llama(root / "target", tiny_models.tokenizer, seed=0, shape=long)
    draft = checkpoints.save_tiny_llama(root / "draft", tiny_models.tokenizer, seed=1, shape=long)
    (target / "chat_template.j2").write_text(TOOLS_TEMPLATE, encoding="utf-8")
    config = ServerConfig.model_validate(
        {
            "model": {"target": str(target), "draft": str(draft), "servedModelName": "tiny"},
            "placement": {"device": "cpu"},
        }
    )
    with run_live(create_app(build_engine(config), served_model_name="tiny")) as live:
        yield live


def test_the_openai_client_receives_an_auto_call_incrementally(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    request: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "weather in oslo?"}],
        "max_tokens": 200,
        "temperature": 0,
        "tools": [WEATHER],
        "extra_body": {"response_format": {"type": "lark_grammar", "lark_grammar": CALL_GRAMMAR}},
    }
    whole = client.chat.completions.create(**request)
    assert whole.choices[0].finish_reason == "tool_calls"
    assert whole.choices[0].message.content == "Checking the weather."
    [expected] = whole.choices[0].message.tool_calls or []

    chunks = list(client.chat.completions.create(**request, stream=True))
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "Checking the weather."
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id is not None
    assert deltas[0].function is not None
    assert deltas[0].function.name == "get_weather"
    fragments = [d.function.arguments for d in deltas if d.function and d.function.arguments]
    assert len(fragments) > 3  # the arguments came as they were generated, not whole at the end
    assert "".join(fragments) == expected.function.arguments
    assert all(d.index == 0 for d in deltas)
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["tool_calls"]
    # the first fragment arrives before the last event: the call is open while its arguments stream
    first_fragment = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].delta.tool_calls)
    assert first_fragment < len(chunks) - 3


@pytest.mark.parametrize("tool_choice", ["auto", "required"])
def test_a_chunk_carries_at_most_one_delta_per_call(
    server: LiveServer, tool_choice: Literal["auto", "required"]
) -> None:
    """OpenAI sends a call's opening and its first fragment in separate chunks; clients that read one delta
    per chunk (instructor's partial streaming) lose the fragment otherwise."""
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    extra = {"response_format": {"type": "lark_grammar", "lark_grammar": CALL_GRAMMAR}}
    chunks = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "weather in oslo?"}],
        max_tokens=200,
        temperature=0,
        tools=[WEATHER],
        tool_choice=tool_choice,
        extra_body=extra if tool_choice == "auto" else {},
        stream=True,
    )
    per_chunk = [[d.index for d in c.choices[0].delta.tool_calls or []] for c in chunks if c.choices]
    assert any(per_chunk)
    assert all(len(indexes) == len(set(indexes)) for indexes in per_chunk)
    openings = [i for i, indexes in enumerate(per_chunk) if indexes]
    assert len(openings) > 1


# Under tool_choice auto, a schema makes the random model answer with one call in the Llama 3.1 form (an
# object naming the function and its arguments), which the server reads as a call.
CALL_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "name": {"const": "get_weather"},
        "arguments": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "pattern": "^[a-z]{3,12}$"},
                "note": {"type": "string", "pattern": "^[a-z]{3,12}$"},
            },
            "required": ["city", "note"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "arguments"],
    "additionalProperties": False,
}


def test_the_responses_stream_opens_an_auto_call_and_streams_its_arguments(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    tool = {"type": "function", "name": "get_weather", "parameters": WEATHER["function"]["parameters"]}
    request: dict[str, Any] = {
        "model": "tiny",
        "input": "weather in oslo?",
        "tools": [tool],
        "tool_choice": "auto",
        "max_output_tokens": 200,
        "temperature": 0,
        "text": {"format": {"type": "json_schema", "name": "call", "schema": CALL_SCHEMA}},
    }
    whole = client.responses.create(**request)
    [expected] = whole.output
    assert expected.type == "function_call"
    assert expected.name == "get_weather"

    events = list(client.responses.create(**request, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:3] == ["response.created", "response.in_progress", "response.output_item.added"]
    assert kinds[-3:] == [
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    added = events[2]
    assert added.item.type == "function_call"
    assert (added.item.name, added.item.arguments, added.item.status) == ("get_weather", "", "in_progress")
    deltas = [e for e in events if e.type == "response.function_call_arguments.delta"]
    assert len(deltas) > 3  # the arguments came as they were generated, not whole at the end
    assert {(e.item_id, e.output_index) for e in deltas} == {(added.item.id, 0)}
    assert "".join(e.delta for e in deltas) == events[-3].arguments == expected.arguments
    final = events[-1].response
    assert final.status == "completed"
    [item] = final.output
    assert item.type == "function_call"
    assert (item.id, item.call_id) == (added.item.id, added.item.call_id)
    assert (item.arguments, item.status) == (expected.arguments, "completed")
    assert json.loads(item.arguments).keys() == {"city", "note"}
