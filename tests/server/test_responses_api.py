"""``/v1/responses`` through the official openai client against a live server with speculation on: its output
is the chat completion of the same conversation (same text, same usage), whole or as typed events; function
calls go round trip; ``previous_response_id`` continues a stored conversation; errors name the field."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.backends.standin import standin_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.executors import ExecutorError, RequestErrors, VerifyRequest
from specdeploy_server.core.scheduler import SchedulerSettings

from tests.server.conftest import LiveServer, TinyModels, run_live

WEATHER_PARAMETERS: Any = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 8}},
    "required": ["city"],
    "additionalProperties": False,
}
WEATHER: Any = {"type": "function", "name": "get_weather", "parameters": WEATHER_PARAMETERS}
TIME: Any = {"type": "function", "name": "get_time", "parameters": {"type": "object", "properties": {}}}
CHAT_WEATHER: Any = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": WEATHER_PARAMETERS},
}


@pytest.fixture(scope="module")
def server(tiny_models: TinyModels) -> Iterator[LiveServer]:
    config = ServerConfig.model_validate(
        {
            "model": {
                "target": str(tiny_models.target),
                "draft": str(tiny_models.draft_same),
                "servedModelName": "tiny",
            },
            "speculative": {"method": "draftTarget", "draftLen": 4},
            "placement": {"device": "cpu"},
        }
    )
    with run_live(create_app(build_engine(config), served_model_name="tiny")) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


def test_a_text_input_answers_as_the_chat_completion_of_the_same_messages(client: openai.OpenAI) -> None:
    result = client.responses.create(
        model="tiny", input="weather in oslo?", instructions="be brief", max_output_tokens=12, temperature=0
    )
    chat = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "weather in oslo?"}],
        max_tokens=12,
        temperature=0,
    )
    assert result.id.startswith("resp_")
    assert result.object == "response"
    assert result.model == "tiny"
    assert result.instructions == "be brief"
    assert result.output_text == chat.choices[0].message.content
    message = result.output[0]
    assert message.type == "message"
    assert message.role == "assistant"
    assert message.content[0].type == "output_text"
    assert message.content[0].annotations == []
    assert result.usage is not None
    assert chat.usage is not None
    assert result.usage.input_tokens == chat.usage.prompt_tokens
    assert result.usage.output_tokens == chat.usage.completion_tokens
    assert result.usage.total_tokens == chat.usage.total_tokens
    assert result.usage.output_tokens_details.reasoning_tokens == 0
    if chat.choices[0].finish_reason == "length":
        assert result.status == "incomplete"
        assert result.incomplete_details is not None
        assert result.incomplete_details.reason == "max_output_tokens"
    else:
        assert result.status == "completed"


def test_message_items_with_content_parts_are_the_chat_messages(client: openai.OpenAI) -> None:
    items: Any = [
        {"role": "developer", "content": "answer in french"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hello"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "bonjour"}]},
        {"role": "user", "content": "and goodbye?"},
    ]
    result = client.responses.create(model="tiny", input=items, max_output_tokens=8, temperature=0)
    chat = client.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "developer", "content": "answer in french"},
            {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "bonjour"},
            {"role": "user", "content": "and goodbye?"},
        ],
        max_tokens=8,
        temperature=0,
    )
    assert result.output_text == chat.choices[0].message.content
    assert result.usage is not None
    assert chat.usage is not None
    assert result.usage.input_tokens == chat.usage.prompt_tokens


def _only_call(response: Any) -> Any:
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1
    return calls[0]


def test_a_function_call_goes_round_trip_with_its_output(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="tiny",
        input="weather in oslo?",
        tools=[WEATHER],
        tool_choice="required",
        max_output_tokens=100,
        temperature=0,
    )
    assert first.status == "completed"
    call = _only_call(first)
    assert call.id is not None
    assert call.id.startswith("fc_")
    assert call.call_id
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    answer: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}
    follow = client.responses.create(
        model="tiny",
        previous_response_id=first.id,
        input=[answer],
        max_output_tokens=10,
        temperature=0,
    )
    assert follow.previous_response_id == first.id
    whole: Any = [
        {"role": "user", "content": "weather in oslo?"},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        answer,
    ]
    resent = client.responses.create(
        model="tiny", input=whole, max_output_tokens=10, temperature=0, store=False
    )
    chat = client.chat.completions.create(
        model="tiny",
        messages=[
            {"role": "user", "content": "weather in oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "sunny, 21 C"},
        ],
        max_tokens=10,
        temperature=0,
    )
    assert follow.usage is not None
    assert resent.usage is not None
    assert chat.usage is not None
    assert follow.usage.input_tokens == resent.usage.input_tokens == chat.usage.prompt_tokens
    assert follow.output_text == resent.output_text == (chat.choices[0].message.content or "")


def test_a_named_tool_choice_calls_that_function(client: openai.OpenAI) -> None:
    result = client.responses.create(
        model="tiny",
        input="what time is it?",
        tools=[WEATHER, TIME],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=100,
        temperature=0,
    )
    call = _only_call(result)
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)
    assert result.tool_choice.type == "function"  # type: ignore[union-attr]


def test_a_json_schema_text_format_constrains_the_output(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"answer": {"type": "string", "maxLength": 10}, "sure": {"type": "boolean"}},
        "required": ["answer", "sure"],
        "additionalProperties": False,
    }
    result = client.responses.create(
        model="tiny",
        input="answer in json",
        text={"format": {"type": "json_schema", "name": "answer", "schema": schema, "strict": True}},
        max_output_tokens=100,
        temperature=0,
    )
    assert result.status == "completed"
    jsonschema.validate(json.loads(result.output_text), schema)
    assert result.text is not None
    assert result.text.format is not None
    assert result.text.format.type == "json_schema"


class Word(BaseModel):
    word: str = Field(max_length=6)


def test_the_parse_helper_gets_an_instance_of_the_model_it_sent(client: openai.OpenAI) -> None:
    parsed = client.responses.parse(
        model="tiny", input="one word", text_format=Word, max_output_tokens=60, temperature=0
    )
    assert parsed.status == "completed"
    assert isinstance(parsed.output_parsed, Word)
    assert Word.model_validate_json(parsed.output_text) == parsed.output_parsed


def test_streamed_events_are_numbered_typed_and_add_up_to_the_whole_response(client: openai.OpenAI) -> None:
    kwargs: Any = {"model": "tiny", "input": "tell me a story", "max_output_tokens": 16, "temperature": 0}
    whole = client.responses.create(**kwargs)
    events = list(client.responses.create(**kwargs, stream=True))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed" if whole.status == "completed" else "response.incomplete",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) > 1
    done = next(e for e in events if e.type == "response.output_text.done")
    assert "".join(deltas) == done.text == whole.output_text
    final = events[-1].response
    assert final.output_text == whole.output_text
    assert final.usage is not None
    assert whole.usage is not None
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert client.responses.retrieve(final.id).output_text == whole.output_text  # stored when it ends


def test_streamed_function_call_arguments_add_up_to_the_call(client: openai.OpenAI) -> None:
    events = list(
        client.responses.create(
            model="tiny",
            input="weather?",
            tools=[WEATHER],
            tool_choice="required",
            max_output_tokens=100,
            temperature=0,
            stream=True,
        )
    )
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    item = next(e.item for e in events if e.type == "response.output_item.done")
    assert item.type == "function_call"
    assert "".join(deltas) == done.arguments == item.arguments
    jsonschema.validate(json.loads(done.arguments), WEATHER_PARAMETERS)
    assert events[-1].type == "response.completed"


def test_the_stream_helper_gives_the_final_response(client: openai.OpenAI) -> None:
    """The helper wants ``response.completed``: a short schema makes the output end before the budget."""
    schema = {
        "type": "object",
        "properties": {"word": {"type": "string", "maxLength": 6}},
        "required": ["word"],
    }
    text: Any = {"format": {"type": "json_schema", "name": "word", "schema": schema}}
    with client.responses.stream(
        model="tiny", input="hello", text=text, max_output_tokens=60, temperature=0
    ) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert "".join(texts) == final.output_text
    jsonschema.validate(json.loads(final.output_text), schema)


def test_a_stored_response_can_be_retrieved_and_deleted(client: openai.OpenAI) -> None:
    made = client.responses.create(model="tiny", input="hello", max_output_tokens=4, metadata={"run": "a"})
    got = client.responses.retrieve(made.id)
    assert got.id == made.id
    assert got.output_text == made.output_text
    assert got.metadata == {"run": "a"}
    client.responses.delete(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)
    unstored = client.responses.create(model="tiny", input="hello", max_output_tokens=4, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)


@pytest.mark.parametrize(
    ("kwargs", "param"),
    [
        ({"previous_response_id": "resp_unknown"}, "previous_response_id"),
        ({"tools": [{"type": "web_search"}]}, "tools"),
        ({"background": True}, "background"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x"}]}]},
            "input",
        ),
        ({"max_output_tokens": 10**6}, "max_output_tokens"),
        (
            {"text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "nope"}}}},
            "text.format",
        ),
        ({"tool_choice": "required"}, "tool_choice"),  # no tools to call
        ({"tools": [WEATHER]}, "tool_choice"),  # auto (the default) needs a template that renders tools
        ({"temperature": 3}, "temperature"),
    ],
)
def test_what_cannot_be_honoured_is_a_bad_request_naming_the_field(
    client: openai.OpenAI, kwargs: dict[str, Any], param: str
) -> None:
    request: Any = {"model": "tiny", "input": "hello", "max_output_tokens": 4, **kwargs}
    with pytest.raises(openai.BadRequestError) as caught:
        client.responses.create(**request)
    assert caught.value.status_code == 400
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == param
    assert error["type"] == "invalid_request_error"


def test_unknown_fields_follow_the_servers_policy_and_unknown_models_are_refused(
    server: LiveServer, client: openai.OpenAI
) -> None:
    # The default policy (warn) serves the request; tests/server/test_request_hygiene.py checks the refusal.
    answer = httpx.post(
        f"{server.base_url}/v1/responses",
        json={"model": "tiny", "input": "hi", "max_output_tokens": 2, "frobnicate": 1},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="nope", input="hi")


def test_stored_response_requests_are_counted_under_one_endpoint_whatever_the_id(
    server: LiveServer, client: openai.OpenAI
) -> None:
    made = client.responses.create(model="tiny", input="hello", max_output_tokens=2)
    client.responses.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_missing")
    text = httpx.get(f"{server.base_url}/metrics").text
    assert 'endpoint="/v1/responses/{response_id}",model="tiny",status="200"' in text
    assert 'endpoint="/v1/responses/{response_id}",model="tiny",status="404"' in text
    assert "resp_" not in text


def test_the_stream_helper_accumulates_a_function_call(client: openai.OpenAI) -> None:
    with client.responses.stream(
        model="tiny", input="weather?", tools=[WEATHER], tool_choice="required", max_output_tokens=100
    ) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    call = _only_call(final)
    assert call.arguments == "".join(deltas)
    jsonschema.validate(json.loads(call.arguments), WEATHER_PARAMETERS)


def test_the_openapi_document_describes_the_responses_routes_and_events(server: LiveServer) -> None:
    document = httpx.get(f"{server.base_url}/openapi.json").json()
    create = document["paths"]["/v1/responses"]["post"]
    ok = create["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/Response"}
    events = ok["text/event-stream"]["schema"]["properties"]["data"]["contentSchema"]["anyOf"]
    names = {ref["$ref"].rsplit("/", 1)[1] for ref in events}
    assert {"OutputTextDeltaEvent", "FunctionCallArgumentsDeltaEvent", "ResponseLifecycleEvent"} <= names
    assert names <= set(document["components"]["schemas"])
    assert {"400", "401", "404", "413", "500", "503"} <= set(create["responses"])
    assert "ResponsesRequest" in create["requestBody"]["content"]["application/json"]["schema"]["$ref"]
    stored = document["paths"]["/v1/responses/{response_id}"]
    assert set(stored) == {"get", "delete"}
    assert {"200", "404"} <= set(stored["get"]["responses"]) & set(stored["delete"]["responses"])


def test_an_executor_failure_mid_stream_is_an_error_event_then_a_failed_response() -> None:
    engine, target = standin_engine(0.001, None, alpha=0.0, settings=SchedulerSettings(draft_len=0))
    original = target.verify
    calls = 0

    async def failing_after_three_steps(batch: Sequence[VerifyRequest]) -> list[list[int]]:
        nonlocal calls
        calls += 1
        if calls > 3:
            raise RequestErrors({r.seq.request_id: ExecutorError("target", "injected fault") for r in batch})
        return await original(batch)

    target.verify = failing_after_three_steps  # type: ignore[method-assign]
    with run_live(create_app(engine)) as live:
        client = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0, timeout=60)
        model = engine.info.served_model_name
        events = list(client.responses.create(model=model, input="hello", max_output_tokens=50, stream=True))
    assert [e.type for e in events][-2:] == ["error", "response.failed"]
    error = events[-2]
    assert error.type == "error"
    assert error.code == "executor_error"
    assert "injected fault" in error.message
    failed = events[-1]
    assert failed.type == "response.failed"
    assert failed.response.status == "failed"
    assert failed.response.error is not None
    assert failed.response.error.code == "server_error"
    assert "injected fault" in failed.response.error.message
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert failed.response.output_text == deltas
    assert [e.sequence_number for e in events] == list(range(len(events)))
