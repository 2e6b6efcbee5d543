"""LangChain's ``ChatOpenAI`` (langchain-openai) against the live server: invoke, stream, structured output
in each of its methods, and tools bound to the model (a forced call, and a call the model makes on its own,
streamed as tool-call chunks)."""

from __future__ import annotations

import json
import re
from typing import Any, Literal

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field

from tests.clients.conftest import MODEL, ClientServer
from tests.clients.schemas import CITY_SCHEMA, City, call_grammar


def _chat(server: ClientServer, **extra: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL,
        base_url=server.v1,
        api_key="unused",  # type: ignore[arg-type]
        temperature=0,
        max_retries=0,
        timeout=120,
        **extra,
    )


class WeatherArgs(BaseModel):
    city: str = Field(max_length=8, pattern="^[a-z]+$")  # bounded: a random model's string ends


@tool(args_schema=WeatherArgs)
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def test_invoke_returns_the_models_text_and_usage(client_server: ClientServer) -> None:
    reply = _chat(client_server, max_tokens=12).invoke([HumanMessage("hello there")])
    assert isinstance(reply, AIMessage)
    assert isinstance(reply.content, str)
    assert reply.content
    assert reply.usage_metadata is not None
    assert 0 < reply.usage_metadata["output_tokens"] <= 12
    assert reply.response_metadata["finish_reason"] in ("length", "stop")
    assert reply.response_metadata["model_name"] == MODEL


def test_streamed_chunks_add_up_to_the_invoked_reply(client_server: ClientServer) -> None:
    chat = _chat(client_server, max_tokens=16, stream_usage=True)
    whole = chat.invoke("tell me about the draft model")
    chunks = list(chat.stream("tell me about the draft model"))
    assert len(chunks) > 2
    total = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    assert isinstance(total, AIMessageChunk)
    assert total.content == whole.content
    assert total.usage_metadata is not None
    assert whole.usage_metadata is not None
    assert total.usage_metadata["output_tokens"] == whole.usage_metadata["output_tokens"]


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_structured_output_is_an_instance_of_the_schema(
    client_server: ClientServer, method: Literal["function_calling", "json_schema"]
) -> None:
    structured = _chat(client_server, max_tokens=120).with_structured_output(
        City, method=method, include_raw=True
    )
    result: Any = structured.invoke("describe a city")
    assert result["parsing_error"] is None
    city = result["parsed"]
    assert isinstance(city, City)
    if method == "function_calling":  # a forced call of the schema's tool
        assert result["raw"].tool_calls[0]["name"] == "City"


def test_json_mode_structured_output_is_a_json_object(client_server: ClientServer) -> None:
    # json_mode asks for any JSON object (the prompt is meant to describe it): a dict schema parses it as is
    structured = _chat(client_server, max_tokens=60).with_structured_output(
        CITY_SCHEMA, method="json_mode", include_raw=True
    )
    result: Any = structured.invoke("describe a city as JSON")
    assert result["parsing_error"] is None
    assert isinstance(result["parsed"], dict)
    assert json.loads(result["raw"].content) == result["parsed"]


def test_a_bound_tool_forced_by_name_is_called_with_valid_arguments(client_server: ClientServer) -> None:
    chat = _chat(client_server, max_tokens=60).bind_tools([get_weather], tool_choice="get_weather")
    reply = chat.invoke("weather in oslo?")
    assert isinstance(reply, AIMessage)
    [call] = reply.tool_calls
    assert call["name"] == "get_weather"
    assert isinstance(call["args"]["city"], str)
    assert reply.response_metadata["finish_reason"] == "tool_calls"
    # the call's answer goes back to the model as a tool message, and the model answers in text
    answer = get_weather.invoke(call)
    follow = (
        _chat(client_server, max_tokens=8)
        .bind_tools([get_weather])
        .invoke([HumanMessage("weather in oslo?"), reply, answer])
    )
    assert isinstance(follow.content, str)


def test_a_call_the_model_makes_on_its_own_streams_as_tool_call_chunks(client_server: ClientServer) -> None:
    """tool_choice auto: the model (steered by a grammar) writes a ``<tool_call>`` block; LangChain gets the
    call, and streamed, its arguments in several chunks."""
    chat = _chat(client_server, max_tokens=80, extra_body={"response_format": call_grammar()})
    bound = chat.bind_tools([get_weather])
    reply = bound.invoke("weather in oslo?")
    assert isinstance(reply, AIMessage)
    [call] = reply.tool_calls
    assert call["name"] == "get_weather"
    assert re.fullmatch("[a-z]{3,8}", call["args"]["city"])
    chunks = list(bound.stream("weather in oslo?"))
    with_args = [c for c in chunks if isinstance(c, AIMessageChunk) and c.tool_call_chunks]
    assert len(with_args) >= 2  # the opening, then the arguments: not one whole call at the end
    total: Any = chunks[0]
    for chunk in chunks[1:]:
        total += chunk
    assert isinstance(total, AIMessageChunk)
    assert [(c["name"], c["args"]) for c in total.tool_calls] == [("get_weather", call["args"])]
