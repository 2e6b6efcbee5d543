"""``tool_choice: auto``: tools rendered by a chat template that supports them, calls parsed out of the
model's own text (Hermes/Qwen ``<tool_call>`` blocks, Llama's bare JSON object)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.api.protocol import ChatCompletionRequest
from specdeploy_server.api.structured import auto_tool_calls
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.tokenizer import ChatTemplate

from tests.server.conftest import LiveServer, TinyModels, run_live

TOOLS_TEMPLATE = (
    "{{ bos_token }}{% if tools %}<|system|>tools: {{ tools | tojson }}\n{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
NAMES = frozenset({"get_weather", "get_time"})


def test_tagged_calls_are_parsed_with_the_text_before_them() -> None:
    text = 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    found = auto_tool_calls(text + '<tool_call>{"name": "get_time", "arguments": {}}</tool_call>', NAMES)
    assert found is not None
    content, calls = found
    assert content == "Let me look."
    assert [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Oslo"}
    assert calls[0]["type"] == "function"
    assert calls[0]["id"] != calls[1]["id"]


def test_a_bare_json_call_with_parameters_is_parsed() -> None:
    found = auto_tool_calls(' {"name": "get_time", "parameters": {"tz": "UTC"}}', NAMES)
    assert found is not None
    assert found[0] is None
    assert json.loads(found[1][0]["function"]["arguments"]) == {"tz": "UTC"}


@pytest.mark.parametrize(
    "text",
    [
        "It is sunny.",
        '{"name": "unknown_tool", "arguments": {}}',
        '<tool_call>{"name": "get_weather", "arguments": {"city": </tool_call>',
        '{"city": "Oslo"}',
    ],
)
def test_text_without_a_complete_call_of_a_known_tool_stays_text(text: str) -> None:
    assert auto_tool_calls(text, NAMES) is None


# A tool-use template in the shape of Llama 3.1's: an assistant's calls rendered from their arguments object,
# a tool's answer with the id of the call it answers, a user's name.
HISTORY_TEMPLATE = (
    "{% for m in messages %}<|{{ m.role }}{% if m.name %}:{{ m.name }}{% endif %}|>"
    "{% for call in m.tool_calls or [] %}"
    "call {{ call.function.name }}(city={{ call.function.arguments.city }})"
    "{% endfor %}{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}{{ m.content }}\n{% endfor %}"
)


def test_a_tool_use_history_reaches_the_chat_template_whole() -> None:
    """The assistant's ``tool_calls`` (arguments as the object their JSON string encodes), the tool's
    ``tool_call_id`` and a message's ``name`` reach the template, as Hugging Face's apply_chat_template
    gets them."""
    request = ChatCompletionRequest.model_validate(
        {
            "model": "tiny",
            "messages": [
                {"role": "user", "content": "weather in Oslo?", "name": "ann"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
            ],
        }
    )
    messages = [m.for_template() for m in request.messages]
    assert messages[1]["tool_calls"][0]["id"] == "c1"
    assert ChatTemplate(HISTORY_TEMPLATE).render(messages) == (
        "<|user:ann|>weather in Oslo?\n<|assistant|>call get_weather(city=Oslo)\n<|tool|>[c1]sunny\n"
    )


@pytest.fixture(scope="module")
def server(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    target = Path(tmp_path_factory.mktemp("tools")) / "target"
    shutil.copytree(tiny_models.target, target)
    (target / "chat_template.j2").write_text(TOOLS_TEMPLATE, encoding="utf-8")
    config = ServerConfig.model_validate(
        {
            "model": {"target": str(target), "draft": str(tiny_models.draft_same), "servedModelName": "tiny"},
            "placement": {"device": "cpu"},
        }
    )
    with run_live(create_app(build_engine(config), served_model_name="tiny")) as live:
        yield live


def test_auto_renders_the_tools_and_returns_the_models_text_when_it_calls_none(server: LiveServer) -> None:
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "weather in oslo?"}]
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=8, temperature=0)
    auto = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0, tools=[WEATHER]
    )
    assert auto.usage is not None
    assert plain.usage is not None
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens + 10  # the tools are in the prompt
    assert auto.choices[0].message.tool_calls is None  # a random model calls nothing
    assert auto.choices[0].message.content
    streamed = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=8, temperature=0, tools=[WEATHER], stream=True
    )
    text = "".join(c.choices[0].delta.content or "" for c in streamed if c.choices)
    assert text == auto.choices[0].message.content
