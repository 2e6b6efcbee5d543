"""pydantic-ai against the live server: structured output (its output tool, and native ``response_format``),
an agent that calls a function tool and answers from its result, and the Responses API model."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic_ai import Agent, NativeOutput
from pydantic_ai.messages import ToolCallPart, ToolReturnPart
from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

from tests.clients.conftest import MODEL, ClientServer
from tests.clients.schemas import City, call_grammar


def _provider(server: ClientServer) -> OpenAIProvider:
    return OpenAIProvider(base_url=server.v1, api_key="unused")


def _settings(extra_body: dict[str, Any] | None = None) -> ModelSettings:
    settings = ModelSettings(temperature=0, max_tokens=120)
    if extra_body is not None:
        settings["extra_body"] = extra_body
    return settings


@pytest.mark.parametrize("native", [False, True])
def test_structured_output_is_an_instance_of_the_output_type(
    client_server: ClientServer, native: bool
) -> None:
    """By default pydantic-ai asks for a call of its output tool; NativeOutput uses ``response_format``."""
    model = OpenAIChatModel(MODEL, provider=_provider(client_server))
    agent = Agent(model, output_type=NativeOutput(City) if native else City, retries=0)
    result = agent.run_sync("describe a city", model_settings=_settings())
    assert isinstance(result.output, City)
    assert result.usage.output_tokens > 0


def test_an_agent_calls_its_function_tool_and_answers_from_the_result(client_server: ClientServer) -> None:
    """The random model is steered by a grammar (``response_format``) into calling the tool under
    ``tool_choice: auto``; the tool lifts the grammar, so the model's next turn is its free answer."""
    extra_body: dict[str, Any] = {"response_format": call_grammar()}
    cities: list[str] = []
    model = OpenAIChatModel(MODEL, provider=_provider(client_server))
    agent = Agent(model, output_type=str, retries=0)

    @agent.tool_plain
    def get_weather(city: str) -> str:
        """The weather in a city."""
        cities.append(city)
        extra_body.pop("response_format")
        return f"sunny in {city}"

    result = agent.run_sync("weather in oslo?", model_settings=_settings(extra_body=extra_body))
    assert len(cities) == 1
    assert re.fullmatch("[a-z]{3,8}", cities[0])
    parts = [part for message in result.all_messages() for part in message.parts]
    calls = [p for p in parts if isinstance(p, ToolCallPart)]
    returns = [p for p in parts if isinstance(p, ToolReturnPart)]
    assert [c.tool_name for c in calls] == ["get_weather"]
    assert [r.content for r in returns] == [f"sunny in {cities[0]}"]
    assert returns[0].tool_call_id == calls[0].tool_call_id
    assert isinstance(result.output, str)
    assert result.output
    assert result.usage.requests == 2


def test_the_responses_model_answers_and_fills_an_output_type(client_server: ClientServer) -> None:
    model = OpenAIResponsesModel(MODEL, provider=_provider(client_server))
    text = Agent(model, output_type=str, retries=0).run_sync("hello there", model_settings=_settings())
    assert isinstance(text.output, str)
    assert text.output
    city = Agent(model, output_type=City, retries=0).run_sync("describe a city", model_settings=_settings())
    assert isinstance(city.output, City)
