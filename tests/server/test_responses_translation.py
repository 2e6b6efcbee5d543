"""The Responses API's pure parts: a request as its chat completion request, chat chunks as typed events, and
the store's bounds (tests/server/test_responses_api.py runs the whole path against a live server)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from specdeploy_server.api.contract import ErrorDetail, ToolCall
from specdeploy_server.api.errors import BadRequestError
from specdeploy_server.api.responses_api.events import EventTranslator
from specdeploy_server.api.responses_api.output import Echo, output_items, response
from specdeploy_server.api.responses_api.protocol import ResponsesRequest
from specdeploy_server.api.responses_api.store import ResponseStore
from specdeploy_server.api.responses_api.translate import chat_request

WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


def _request(**fields: Any) -> ResponsesRequest:
    return ResponsesRequest.model_validate({"model": "tiny", "input": "hi", **fields})


def test_a_string_input_is_one_user_message_after_the_instructions() -> None:
    chat = chat_request(_request(instructions="be brief", max_output_tokens=7, temperature=0.5), [])
    assert [m.for_template() for m in chat.messages] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert chat.max_completion_tokens == 7
    assert chat.temperature == 0.5
    assert chat.stream is False


def test_function_calls_join_the_assistant_message_before_them_and_outputs_become_tool_messages() -> None:
    items = [
        {"role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "weather?"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": '{"city":"Oslo"}'},
        {"type": "function_call", "call_id": "c2", "name": "get_weather", "arguments": '{"city":"Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "rain"}]},
    ]
    messages = [m.for_template() for m in chat_request(_request(input=items), []).messages]
    assert [m["role"] for m in messages] == ["developer", "user", "assistant", "tool", "tool"]
    assistant = messages[2]
    assert assistant["content"] == "Checking."
    assert [c["id"] for c in assistant["tool_calls"]] == ["c1", "c2"]
    assert assistant["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}  # as templates read it
    assert messages[3] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    assert messages[4]["content"] == "rain"


def test_the_history_of_a_previous_response_comes_before_the_new_input() -> None:
    history: list[dict[str, Any]] = [
        {"type": "message", "role": "user", "content": "first"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "answer"}]},
    ]
    chat = chat_request(_request(input="second", instructions="new rules"), history)
    assert [(m.role, m.text()) for m in chat.messages] == [
        ("system", "new rules"),
        ("user", "first"),
        ("assistant", "answer"),
        ("user", "second"),
    ]


def test_tools_tool_choice_and_text_format_become_their_chat_fields() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    chat = chat_request(
        _request(
            tools=[WEATHER],
            tool_choice={"type": "function", "name": "get_weather"},
        ),
        [],
    )
    assert chat.tools is not None
    assert chat.tools[0].function.name == "get_weather"
    assert chat.tools[0].function.strict is True
    assert chat.tools[0].function.parameters == WEATHER["parameters"]
    assert chat.tool_choice is not None
    assert not isinstance(chat.tool_choice, str)
    assert chat.tool_choice.function.name == "get_weather"
    text = {"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}}
    assert chat_request(_request(text=text), []).response_format == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": schema, "strict": True},
    }
    assert chat_request(_request(text={"format": {"type": "json_object"}}), []).response_format == {
        "type": "json_object"
    }
    streamed = chat_request(_request(stream=True), [])
    assert streamed.stream is True
    assert streamed.stream_options is not None
    assert streamed.stream_options.include_usage


def test_a_text_format_applies_to_text_so_a_forced_call_goes_without_it() -> None:
    fmt = {"format": {"type": "json_object"}}
    assert (
        chat_request(_request(tools=[WEATHER], tool_choice="required", text=fmt), []).response_format is None
    )
    assert chat_request(_request(tools=[WEATHER], text=fmt), []).response_format == {"type": "json_object"}


@pytest.mark.parametrize(
    ("fields", "param", "words"),
    [
        ({"tools": [{"type": "web_search"}]}, "tools", "web_search"),
        ({"tools": [{"type": "function", "name": "bad name"}]}, "tools", "tools[0].name"),
        ({"tool_choice": {"type": "allowed_tools", "tools": []}}, "tool_choice", "allowed_tools"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function"}},
            "tool_choice",
            "needs the function's name",
        ),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
            "input",
            "[0]",
        ),
        ({"input": [{"type": "reasoning", "summary": []}]}, "input", "reasoning"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input", "item references"),
        ({"input": [{"role": "tool", "content": "x"}]}, "input", "input[0].role"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input", "call_id"),
        ({"input": []}, "input", "no items"),
    ],
)
def test_what_has_no_chat_counterpart_is_refused_naming_the_field(
    fields: dict[str, Any], param: str, words: str
) -> None:
    with pytest.raises(BadRequestError) as caught:
        chat_request(_request(**fields), [])
    assert caught.value.param == param
    assert words in caught.value.message


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"background": True}, "background"),
        ({"reasoning": {"effort": "high"}}, "reasoning"),
        ({"truncation": "auto"}, "truncation"),
        ({"include": ["message.output_text.logprobs"]}, "include"),
        ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
        ({"metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
        ({"conversation": "conv_1"}, "conversation"),
    ],
)
def test_options_this_server_cannot_honour_are_named(fields: dict[str, Any], param: str) -> None:
    problem = _request(**fields).unsupported()
    assert problem is not None
    assert problem[0] == param


def test_a_chat_answer_becomes_a_message_and_function_call_items() -> None:
    call = ToolCall.model_validate(
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    )
    items = output_items("Let me check.", [call, call], "tool_calls", parallel=True)
    assert [item.type for item in items] == ["message", "function_call", "function_call"]
    assert [item.type for item in output_items(None, [call, call], "tool_calls", parallel=False)] == [
        "function_call"
    ]
    cut = response(Echo.of(_request()), output_items("abc", [], "length", parallel=True), "length", None)
    assert cut.status == "incomplete"
    assert cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    assert cut.output[0].status == "incomplete"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def _call_delta(index: int, arguments: str, **first: str) -> dict[str, Any]:
    function: dict[str, Any] = {"arguments": arguments}
    if "name" in first:
        function["name"] = first["name"]
    call: dict[str, Any] = {"index": index, "function": function}
    if "id" in first:
        call.update(id=first["id"], type="function")
    return {"tool_calls": [call]}


def _translate(chunks: list[dict[str, Any]], **fields: Any) -> tuple[list[dict[str, Any]], EventTranslator]:
    translator = EventTranslator(Echo.of(_request(**fields)))
    events = translator.start()
    for chunk in chunks:
        events += translator.chunk(chunk)
    events += translator.end()
    return [json.loads(e.model_dump_json(exclude_unset=True)) for e in events], translator


def test_text_then_incremental_call_arguments_stream_as_typed_events_in_order() -> None:
    chunks = [
        _chunk({"role": "assistant", "content": ""}),
        _chunk({"content": "Hel"}),
        _chunk({"content": "lo"}),
        _chunk(_call_delta(0, '{"ci', id="call_9", name="get_weather")),
        _chunk(_call_delta(0, 'ty": "Oslo"}')),
        _chunk({}, "tool_calls"),
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 9, "total_tokens": 14}},
    ]
    events, translator = _translate(chunks)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.delta",
        "response.output_text.delta",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert events[6]["text"] == "Hello"
    assert events[12]["arguments"] == '{"city": "Oslo"}'
    final = events[-1]["response"]
    assert final["status"] == "completed"
    assert [item["type"] for item in final["output"]] == ["message", "function_call"]
    assert final["output"][1]["call_id"] == "call_9"
    assert final["output"][0]["id"] == events[2]["item"]["id"]
    assert final["usage"]["total_tokens"] == 14
    assert translator.final is not None


def test_a_stream_cut_by_the_token_budget_ends_incomplete_and_one_without_text_has_an_empty_message() -> None:
    events, _ = _translate([_chunk({"content": "abc"}), _chunk({}, "length")])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    events, _ = _translate([_chunk({}, "stop")])
    assert [e["type"] for e in events][2:] == [
        "response.output_item.added",
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]


def test_without_parallel_tool_calls_only_the_first_streamed_call_is_kept() -> None:
    chunks = [
        _chunk({**_call_delta(0, "{}", id="a", name="f")}),
        _chunk({**_call_delta(1, "{}", id="b", name="f")}),
        _chunk({}, "tool_calls"),
    ]
    events, _ = _translate(chunks, parallel_tool_calls=False)
    assert [item["call_id"] for item in events[-1]["response"]["output"]] == ["a"]


def test_the_store_forgets_responses_after_their_ttl_and_beyond_its_bounds() -> None:
    now = [0.0]
    store = ResponseStore(ttl_seconds=10, max_responses=2, clock=lambda: now[0])
    made = [response(Echo.of(_request()), [], "stop", None) for _ in range(3)]
    for item in made:
        store.put(item, [{"type": "message", "role": "user", "content": "hi"}])
    assert store.get(made[0].id) is None  # the oldest went first
    assert store.get(made[2].id) is not None
    now[0] = 11.0
    assert store.get(made[2].id) is None
    assert len(store) == 0
    small = ResponseStore(max_chars=10)
    small.put(made[0], [])
    assert small.get(made[0].id) is None  # larger than the whole budget


def test_a_failure_after_the_stream_began_is_an_error_event_then_a_failed_response() -> None:
    translator = EventTranslator(Echo.of(_request()))
    translator.start()
    translator.chunk(_chunk({"content": "partial"}))
    detail = ErrorDetail(
        message="generation failed: boom", type="server_error", param=None, code="executor_error"
    )
    error, failed = [json.loads(e.model_dump_json()) for e in translator.failed(detail)]
    assert error == {
        "sequence_number": 5,  # after created, in_progress, item added, part added, the delta
        "type": "error",
        "code": "executor_error",
        "message": "generation failed: boom",
        "param": None,
    }
    assert failed["type"] == "response.failed"
    assert failed["sequence_number"] == 6
    assert failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "server_error", "message": "generation failed: boom"}
    message = failed["response"]["output"][0]
    assert message["content"][0]["text"] == "partial"
    assert message["status"] == "incomplete"


def test_a_call_cut_by_the_token_budget_is_incomplete_whole_or_streamed() -> None:
    call = ToolCall.model_validate(
        {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    )
    assert output_items(None, [call], "length", parallel=True)[0].status == "incomplete"
    events, _ = _translate([_chunk(_call_delta(0, '{"a"', id="c", name="f")), _chunk({}, "length")])
    assert events[-2]["item"]["status"] == "incomplete"
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["output"][0]["status"] == "incomplete"
