"""Whether structured output can be served is decided once, at start-up: a tokenizer the grammar engine
cannot read (a character-level one whose decoder is a bare ``Fuse``) makes ``response_format`` and forced
tool calls a 400 naming the field and the reason, says so in ``/v1/models``, and leaves plain generation
working."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_testkit import checkpoints

from tests.server.conftest import LiveServer, TinyModels, run_live

TOOL: Any = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}},
}


def _serve(target: Path) -> Iterator[LiveServer]:
    config = ServerConfig.model_validate(
        {"model": {"target": str(target), "servedModelName": "tiny"}, "placement": {"device": "cpu"}}
    )
    with run_live(create_app(build_engine(config), served_model_name="tiny")) as live:
        yield live


@pytest.fixture(scope="module")
def char_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("char-model")
    tokenizer = root / "tokenizer"
    tokenizer.mkdir()
    checkpoints.train_char_tokenizer(tokenizer)
    return checkpoints.save_tiny_llama(root / "target", tokenizer, seed=0)


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_an_unreadable_tokenizer_turns_structured_output_off_once_with_a_400_naming_the_field(
    char_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="specdeploy_server.api.serving")
    for live in _serve(char_model):
        client = _client(live)
        card = client.models.retrieve("tiny")
        assert (card.model_extra or {})["structured_output"] is False
        messages: Any = [{"role": "user", "content": "hello"}]
        for _ in range(2):
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(
                    model="tiny", messages=messages, max_tokens=4, response_format={"type": "json_object"}
                )
            body = caught.value.body
            assert isinstance(body, dict)
            assert body["param"] == "response_format"
            assert "can't determine decoder type" in body["message"]
            with pytest.raises(openai.BadRequestError) as caught:
                client.chat.completions.create(
                    model="tiny", messages=messages, max_tokens=4, tools=[TOOL], tool_choice="required"
                )
            body = caught.value.body
            assert isinstance(body, dict)
            assert body["param"] == "tool_choice"
        plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=4, temperature=0)
        assert plain.choices[0].finish_reason in ("length", "stop")
    decided = [r for r in caplog.records if "structured output" in r.getMessage()]
    assert len(decided) == 1
    assert decided[0].levelno == logging.WARNING


def test_a_readable_tokenizer_serves_structured_output_and_says_so(tiny_models: TinyModels) -> None:
    for live in _serve(tiny_models.target):
        client = _client(live)
        assert (client.models.retrieve("tiny").model_extra or {})["structured_output"] is True
        result = client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hello"}],
            max_tokens=40,
            temperature=0,
            response_format={"type": "json_object"},
        )
        assert result.choices[0].message.content is not None
