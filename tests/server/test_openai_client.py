"""The official openai package against a real uvicorn server running the reference backend."""

from __future__ import annotations

from collections.abc import Iterator

import openai
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_testkit import sample_text

from tests.server.conftest import LiveServer, TinyModels, run_live


@pytest.fixture(scope="module")
def server(tiny_models: TinyModels) -> Iterator[LiveServer]:
    config = ServerConfig.model_validate(
        {
            "model": {
                "target": str(tiny_models.target),
                "draft": str(tiny_models.draft_same),
                "servedModelName": "tiny",
            },
            "placement": {"device": "cpu"},
        }
    )
    app = create_app(build_engine(config), served_model_name=config.model.name)
    with run_live(app) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_models_lists_the_served_model_name(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == ["tiny"]


def test_completion_returns_text_usage_and_finish_reason(client: openai.OpenAI) -> None:
    result = client.completions.create(model="tiny", prompt="the draft model", max_tokens=12, temperature=0)
    choice = result.choices[0]
    assert choice.finish_reason in ("length", "stop")
    assert result.usage is not None
    assert result.usage.prompt_tokens > 0
    assert 0 < result.usage.completion_tokens <= 12
    again = client.completions.create(model="tiny", prompt="the draft model", max_tokens=12, temperature=0)
    assert again.choices[0].text == choice.text  # greedy is deterministic


def test_streamed_completion_concatenates_to_the_non_streamed_text(client: openai.OpenAI) -> None:
    prompt = sample_text.prompts(1, seed=3)[0]
    whole = client.completions.create(model="tiny", prompt=prompt, max_tokens=20, temperature=0)
    chunks = list(
        client.completions.create(model="tiny", prompt=prompt, max_tokens=20, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    final = [c for c in chunks if c.choices and c.choices[0].finish_reason is not None]
    assert len(final) == 1
    assert final[0].usage is not None
    assert final[0].usage.completion_tokens == whole.usage.completion_tokens  # type: ignore[union-attr]


def test_chat_completion_uses_the_chat_template(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello world"}],
        max_tokens=10,
        temperature=0,
    )
    assert result.choices[0].message.role == "assistant"
    assert result.usage is not None
    # <s><|system|>be brief\n<|user|>hello world\n<|assistant|> is longer than the bare text
    assert result.usage.prompt_tokens > len("be brief hello world") // 4


def test_streamed_chat_sends_role_first_then_content_then_usage(client: openai.OpenAI) -> None:
    kwargs = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "speculative decoding"}],
        "temperature": 0,
    }
    whole = client.chat.completions.create(max_tokens=16, **kwargs)  # type: ignore[call-overload]
    stream = client.chat.completions.create(
        max_tokens=16, stream=True, stream_options={"include_usage": True}, **kwargs
    )  # type: ignore[call-overload]
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    # Only there: a client that adds up usage across chunks (LangChain's stream_usage) counts it once.
    assert [c.usage is not None for c in chunks].count(True) == 1


def test_a_stop_string_ends_the_completion_before_it(client: openai.OpenAI) -> None:
    prompt = "the draft model"
    free = (
        client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0).choices[0].text
    )
    assert len(free) > 6
    stop = free[3:6]
    cut = free[: free.index(stop)]
    result = client.completions.create(model="tiny", prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
    assert result.choices[0].text == cut
    assert result.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=24, temperature=0, stop=[stop], stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == cut


def test_unknown_model_raises_not_found(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model="gpt-4", prompt="x", max_tokens=1)
    assert "gpt-4" in str(info.value)


def test_best_of_is_a_bad_request_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=1, best_of=2)
    assert "best_of" in str(info.value)
