"""The sampling extensions of vLLM, SGLang and trtllm-serve (``ignore_eos``, ``min_tokens``,
``stop_token_ids``, ``skip_special_tokens``, ``include_stop_str_in_output``) through the official openai
client against a live server with speculation on: their meaning, and greedy output equal to plain
decoding."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import openai
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig

from tests.server.conftest import LiveServer, TinyModels, run_live
from tests.server.plain_decoding import PlainDecoder

PROMPT = "speculative decoding drafts tokens"


def _server(target: str, draft: str, draft_len: int) -> Iterator[LiveServer]:
    config = ServerConfig.model_validate(
        {
            "model": {"target": target, "draft": draft, "servedModelName": "tiny"},
            "speculative": {"draftLen": draft_len},
            "placement": {"device": "cpu"},
        }
    )
    with run_live(create_app(build_engine(config), served_model_name="tiny")) as live:
        yield live


@pytest.fixture(scope="module")
def same_draft(tiny_models: TinyModels) -> Iterator[LiveServer]:
    yield from _server(str(tiny_models.target), str(tiny_models.draft_same), 4)


@pytest.fixture(scope="module")
def unrelated_draft(tiny_models: TinyModels) -> Iterator[LiveServer]:
    yield from _server(str(tiny_models.target), str(tiny_models.draft_unrelated), 3)


def _client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _plain(
    plain: PlainDecoder,
    prompt: Sequence[int],
    max_tokens: int,
    *,
    stops: frozenset[int],
    min_tokens: int = 0,
    bias: dict[int, float] | None = None,
) -> list[int]:
    """Plain greedy decoding with vLLM's meaning of the extensions: ``stops`` end the sequence and are masked
    while fewer than ``min_tokens`` tokens were generated."""
    out: list[int] = []
    while len(out) < max_tokens:
        x = plain.logits([*prompt, *out])
        for token, value in (bias or {}).items():
            x[token] += value
        if len(out) < min_tokens:
            x[sorted(stops)] = -np.inf
        out.append(int(np.argmax(x)))
        if out[-1] in stops:
            break
    return out


@pytest.mark.parametrize("server_name", ["same_draft", "unrelated_draft"])
def test_ignore_eos_generates_exactly_max_tokens_even_when_the_model_wants_to_stop(
    server_name: str, request: pytest.FixtureRequest, plain: PlainDecoder
) -> None:
    client = _client(request.getfixturevalue(server_name))
    eos = plain.eos
    bias = {str(eos): 100}  # the target wants to end at every position
    stopped = client.completions.create(
        model="tiny", prompt=PROMPT, max_tokens=16, temperature=0, logit_bias=bias
    )
    assert stopped.usage is not None
    assert stopped.usage.completion_tokens == 1
    assert stopped.choices[0].finish_reason == "stop"
    result = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=16,
        temperature=0,
        logit_bias=bias,
        extra_body={"ignore_eos": True},
    )
    assert result.usage is not None
    assert result.usage.completion_tokens == 16
    assert result.choices[0].finish_reason == "length"


@pytest.mark.parametrize("server_name", ["same_draft", "unrelated_draft"])
def test_min_tokens_masks_the_end_of_sequence_until_reached_and_equals_plain_decoding(
    server_name: str, request: pytest.FixtureRequest, plain: PlainDecoder
) -> None:
    client = _client(request.getfixturevalue(server_name))
    prompt = plain.tokenizer.encode(PROMPT)
    eos = plain.eos
    expected = _plain(plain, prompt, 20, stops=frozenset({eos}), min_tokens=7, bias={eos: 100.0})
    assert len(expected) == 8
    assert expected[-1] == eos
    result = client.completions.create(
        model="tiny",
        prompt=prompt,
        max_tokens=20,
        temperature=0,
        logit_bias={str(eos): 100},
        extra_body={"min_tokens": 7, "skip_special_tokens": False},
    )
    assert result.usage is not None
    assert result.usage.completion_tokens == 8
    assert result.choices[0].finish_reason == "stop"
    assert result.choices[0].text == plain.tokenizer.decode(expected, skip_special_tokens=False)


@pytest.mark.parametrize("server_name", ["same_draft", "unrelated_draft"])
def test_stop_token_ids_end_the_output_after_min_tokens_exactly_as_plain_decoding(
    server_name: str, request: pytest.FixtureRequest, plain: PlainDecoder
) -> None:
    server = request.getfixturevalue(server_name)
    client = _client(server)
    prompt = plain.tokenizer.encode(PROMPT)
    free = _plain(plain, prompt, 24, stops=frozenset({plain.eos}))
    first = next(i for i in range(2, len(free)) if free[i] not in free[:i])
    stop = free[first]  # a token the model emits early, for the first time there
    stops = frozenset({plain.eos, stop})
    for min_tokens in (0, first + 3):
        expected = _plain(plain, prompt, 24, stops=stops, min_tokens=min_tokens)
        result = client.completions.create(
            model="tiny",
            prompt=prompt,
            max_tokens=24,
            temperature=0,
            extra_body={"stop_token_ids": [stop], "min_tokens": min_tokens, "skip_special_tokens": False},
        )
        assert result.choices[0].text == plain.tokenizer.decode(expected, skip_special_tokens=False)
        assert result.usage is not None
        assert result.usage.completion_tokens == len(expected)
        ended_on_stop = expected[-1] in stops
        assert result.choices[0].finish_reason == ("stop" if ended_on_stop else "length")
        if min_tokens == 0:
            assert expected[-1] == stop
            assert len(expected) == first + 1
        speculative = (result.model_extra or {})["speculative"]
        assert speculative["draft_tokens"] > 0
        if server_name == "same_draft":  # the draft masks the stop tokens as the target does
            assert speculative["accepted_draft_tokens"] == speculative["draft_tokens"]


def test_include_stop_str_in_output_keeps_the_stop_string(same_draft: LiveServer) -> None:
    client = _client(same_draft)
    free = (
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0).choices[0].text
    )
    at = next(
        i for i in range(1, len(free) - 3) if free.find(free[i : i + 3]) == i and free[i : i + 3].isalpha()
    )
    stop = free[at : at + 3]  # a stop string that first occurs inside the output
    cut = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=24, temperature=0, stop=[stop])
    assert cut.choices[0].text == free[:at]
    kept = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=24,
        temperature=0,
        stop=[stop],
        extra_body={"include_stop_str_in_output": True},
    )
    assert kept.choices[0].text == free[: at + 3]
    assert kept.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model="tiny",
        prompt=PROMPT,
        max_tokens=24,
        temperature=0,
        stop=[stop],
        stream=True,
        extra_body={"include_stop_str_in_output": True},
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == free[: at + 3]


def test_skip_special_tokens_false_keeps_the_end_of_sequence_text(
    same_draft: LiveServer, plain: PlainDecoder
) -> None:
    client = _client(same_draft)
    eos_text = plain.tokenizer.convert_ids_to_tokens(plain.eos)
    bias = {str(plain.eos): 100}
    kept = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=4,
        temperature=0,
        logit_bias=bias,
        extra_body={"skip_special_tokens": False},
    )
    assert kept.choices[0].message.content == eos_text
    skipped = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": PROMPT}],
        max_tokens=4,
        temperature=0,
        logit_bias=bias,
    )
    assert skipped.choices[0].message.content == ""


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"min_tokens": 30}, "min_tokens"),
        ({"min_tokens": -1}, "min_tokens"),
        ({"stop_token_ids": [10**9]}, "stop_token_ids"),
        ({"ignore_eos": True, "response_format": {"type": "json_object"}}, "ignore_eos"),
        ({"min_tokens": 2, "response_format": {"type": "json_object"}}, "min_tokens"),
    ],
)
def test_extension_values_the_server_cannot_honour_are_refused_naming_the_field(
    same_draft: LiveServer, extra: dict[str, Any], param: str
) -> None:
    client = _client(same_draft)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="tiny", prompt=PROMPT, max_tokens=20, extra_body=extra)
    body: Any = caught.value.body
    assert body["param"] == param
