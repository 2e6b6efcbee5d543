"""LiteLLM's ``completion`` against the live server as an OpenAI-compatible endpoint (``openai/<model>`` with
``api_base``): a chat answer with its usage, and the same answer streamed."""

from __future__ import annotations

from typing import Any

import litellm

from tests.clients.conftest import MODEL, ClientServer

MESSAGES = [{"role": "user", "content": "tell me about speculative decoding"}]


def _request(server: ClientServer) -> dict[str, Any]:
    return {
        "model": f"openai/{MODEL}",
        "api_base": server.v1,
        "api_key": "unused",
        "messages": MESSAGES,
        "max_tokens": 16,
        "temperature": 0,
        "num_retries": 0,
        "timeout": 120,
    }


def test_chat_returns_the_models_text_and_usage(client_server: ClientServer) -> None:
    response: Any = litellm.completion(**_request(client_server))
    choice = response.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("length", "stop")
    assert 0 < response.usage.completion_tokens <= 16
    assert response.usage.prompt_tokens > 0
    again: Any = litellm.completion(**_request(client_server))
    assert again.choices[0].message.content == choice.message.content  # greedy is deterministic


def test_streamed_chat_adds_up_to_the_same_text(client_server: ClientServer) -> None:
    whole: Any = litellm.completion(**_request(client_server))
    chunks: list[Any] = list(
        litellm.completion(**_request(client_server), stream=True, stream_options={"include_usage": True})
    )
    assert len(chunks) > 2
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    rebuilt: Any = litellm.stream_chunk_builder(chunks, messages=MESSAGES)
    assert rebuilt.choices[0].message.content == text
    assert rebuilt.usage.completion_tokens == whole.usage.completion_tokens
