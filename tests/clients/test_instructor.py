"""instructor against the live server: a response model filled in tools mode (a forced call) and in JSON
schema mode (``response_format: json_schema``), and partial objects streamed as the call's arguments grow."""

from __future__ import annotations

from typing import Any

import instructor
import openai
import pytest

from tests.clients.conftest import MODEL, ClientServer
from tests.clients.schemas import City

MESSAGES: list[Any] = [{"role": "user", "content": "describe a city"}]


def _client(server: ClientServer, mode: instructor.Mode) -> instructor.Instructor:
    raw = openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)
    return instructor.from_openai(raw, mode=mode)


@pytest.mark.parametrize("mode", [instructor.Mode.TOOLS, instructor.Mode.JSON_SCHEMA])
def test_the_response_model_is_filled_without_retries(
    client_server: ClientServer, mode: instructor.Mode
) -> None:
    client = _client(client_server, mode)
    city, completion = client.chat.completions.create_with_completion(
        model=MODEL,
        response_model=City,
        messages=MESSAGES,
        max_tokens=120,
        temperature=0,
        max_retries=0,  # a first answer that does not validate fails the test
    )
    assert isinstance(city, City)
    choice = completion.choices[0]
    if mode == instructor.Mode.TOOLS:
        assert choice.finish_reason == "tool_calls"
        assert choice.message.tool_calls is not None
        assert choice.message.tool_calls[0].function.name == "City"
    else:
        assert choice.finish_reason == "stop"
        assert City.model_validate_json(choice.message.content or "").model_dump() == city.model_dump()


def test_partial_objects_arrive_as_the_arguments_are_generated(client_server: ClientServer) -> None:
    client = _client(client_server, instructor.Mode.TOOLS)
    partials = list(
        client.chat.completions.create_partial(
            model=MODEL,
            response_model=City,
            messages=MESSAGES,
            max_tokens=120,
            temperature=0,
            max_retries=0,
        )
    )
    filled = [sum(value is not None for value in p.model_dump().values()) for p in partials]
    # the object grows field by field over several partials (not one whole object at the end)
    assert len(set(filled)) >= 3
    assert filled == sorted(filled)
    assert filled[0] < 3
    # the last partial is the whole object, valid against the schema
    City.model_validate(partials[-1].model_dump())
