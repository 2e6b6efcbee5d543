"""The OpenAI fields users expect, through the official openai client, with speculation on: n, logprobs,
echo, penalties, logit_bias, top_k, min_p and tools. Greedy output must equal plain greedy decoding with the
same settings (tests/server/plain_decoding.py, written independently of the server); logprobs must equal the
target's own forward pass."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import jsonschema
import numpy as np
import openai
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.tokenizer import HFTokenizer
from specdeploy_testkit import sample_text

from tests.server.conftest import LiveServer, TinyModels, run_live
from tests.server.plain_decoding import Penalties, PlainDecoder

PROMPTS = sample_text.prompts(4, seed=5)
MAX_TOKENS = 24


@pytest.fixture(scope="module", params=["draftTarget", "promptLookup"])
def server(request: pytest.FixtureRequest, tiny_models: TinyModels) -> Iterator[LiveServer]:
    model: dict[str, Any] = {"target": str(tiny_models.target), "servedModelName": "tiny"}
    if request.param == "draftTarget":
        model["draft"] = str(tiny_models.draft_same)  # proposes the unpenalised argmax: penalties reject it
    config = ServerConfig.model_validate(
        {
            "model": model,
            "speculative": {"method": request.param, "draftLen": 4},
            "placement": {"device": "cpu"},
        }
    )
    with run_live(create_app(build_engine(config), served_model_name="tiny")) as live:
        yield live


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer(tiny_models: TinyModels) -> HFTokenizer:
    return HFTokenizer(tiny_models.target)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    out: np.ndarray = x - np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return out


def test_n_greedy_choices_are_identical_and_n_sampled_choices_independent_but_seeded(
    client: openai.OpenAI,
) -> None:
    greedy = client.completions.create(model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0, n=3)
    assert [c.index for c in greedy.choices] == [0, 1, 2]
    assert len({c.text for c in greedy.choices}) == 1
    assert greedy.usage is not None
    assert greedy.usage.completion_tokens == 3 * 12 or greedy.choices[0].finish_reason == "stop"

    def sampled() -> list[str | None]:
        result = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=12, n=2, seed=7
        )
        return [c.message.content for c in result.choices]

    first = sampled()
    assert first == sampled()
    assert first[0] != first[1]


def test_streamed_n_choices_concatenate_to_the_non_streamed_choices(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": 16, "temperature": 0.9}
    whole = client.completions.create(n=2, seed=3, **kwargs)
    texts = ["", ""]
    finishes = 0
    for chunk in client.completions.create(n=2, seed=3, stream=True, **kwargs):
        for choice in chunk.choices:
            texts[choice.index] += choice.text
            finishes += choice.finish_reason is not None
    assert texts == [c.text for c in whole.choices]
    assert finishes == 2


def test_completion_logprobs_are_the_targets_own_log_probabilities(
    client: openai.OpenAI, plain: PlainDecoder, tokenizer: HFTokenizer
) -> None:
    prompt_ids = tokenizer.encode(PROMPTS[2])
    result = client.completions.create(
        model="tiny", prompt=prompt_ids, max_tokens=MAX_TOKENS, temperature=0, logprobs=3
    )
    logprobs = result.choices[0].logprobs
    assert logprobs is not None
    assert logprobs.token_logprobs is not None
    assert logprobs.top_logprobs is not None
    output = plain.greedy(prompt_ids, MAX_TOKENS)
    assert len(logprobs.token_logprobs) == len(output)
    forward = _log_softmax(plain.all_logits([*prompt_ids, *output]))
    for j, token in enumerate(output):
        row = forward[len(prompt_ids) + j - 1]
        assert logprobs.token_logprobs[j] == pytest.approx(row[token], abs=1e-4)
        assert len(logprobs.top_logprobs[j]) <= 3
        assert max(logprobs.top_logprobs[j].values()) == pytest.approx(row.max(), abs=1e-4)
    assert "".join(logprobs.tokens or []) == result.choices[0].text


def test_usage_and_logprobs_end_at_the_token_that_completes_a_stop_string(client: openai.OpenAI) -> None:
    """A step that accepts several drafts may go past a stop string: the tokens after the one completing it
    count nowhere (usage, logprobs, streamed or not), exactly as when decoding one token at a time."""
    whole = client.completions.create(
        model="tiny", prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0, logprobs=0
    )
    assert whole.choices[0].logprobs is not None
    tokens = whole.choices[0].logprobs.tokens or []
    text = whole.choices[0].text
    assert "".join(tokens) == text
    assert len(tokens) == MAX_TOKENS
    # A stop string that starts inside the text, a few tokens in, and ends a few tokens before its end.
    start = len("".join(tokens[:3])) + 1
    stop = text[start : start + 2]
    cut = text.find(stop)
    kept = next(i + 1 for i in range(len(tokens)) if stop in "".join(tokens[: i + 1]))
    assert 3 <= kept < MAX_TOKENS - 2, (tokens, stop)

    stopped = client.completions.create(
        model="tiny", prompt=PROMPTS[1], max_tokens=MAX_TOKENS, temperature=0, logprobs=0, stop=[stop]
    )
    choice = stopped.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.text == text[:cut]
    assert choice.logprobs is not None
    assert choice.logprobs.tokens == tokens[:kept]
    assert stopped.usage is not None
    assert stopped.usage.completion_tokens == kept

    streamed = list(
        client.completions.create(
            model="tiny",
            prompt=PROMPTS[1],
            max_tokens=MAX_TOKENS,
            temperature=0,
            logprobs=0,
            stop=[stop],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    pieces = [c.choices[0] for c in streamed if c.choices]
    assert "".join(p.text for p in pieces) == text[:cut]
    assert [t for p in pieces if p.logprobs for t in p.logprobs.tokens or []] == tokens[:kept]
    assert streamed[-1].usage is not None
    assert streamed[-1].usage.completion_tokens == kept
    assert [c.usage is not None for c in streamed].count(True) == 1


def test_chat_logprobs_are_the_targets_own_log_probabilities(
    client: openai.OpenAI, plain: PlainDecoder, tokenizer: HFTokenizer
) -> None:
    messages: list[Any] = [{"role": "user", "content": PROMPTS[3]}]
    result = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    assert result.choices[0].logprobs is not None
    content = result.choices[0].logprobs.content
    assert content is not None
    prompt = tokenizer.encode(tokenizer.render_chat(messages), add_special_tokens=False)
    output = plain.greedy(prompt, MAX_TOKENS)
    assert len(content) == len(output)
    forward = _log_softmax(plain.all_logits([*prompt, *output]))
    for j, (item, token) in enumerate(zip(content, output, strict=True)):
        row = forward[len(prompt) + j - 1]
        assert item.token == tokenizer.decode([token])
        assert item.logprob == pytest.approx(row[token], abs=1e-4)
        assert [t.logprob for t in item.top_logprobs] == pytest.approx(sorted(row)[::-1][:2], abs=1e-4)


def test_echo_returns_the_prompt_before_the_completion_with_its_logprobs(
    client: openai.OpenAI, plain: PlainDecoder, tokenizer: HFTokenizer
) -> None:
    prompt = PROMPTS[0]
    plain_text = (
        client.completions.create(model="tiny", prompt=prompt, max_tokens=8, temperature=0).choices[0].text
    )
    echoed = client.completions.create(
        model="tiny", prompt=prompt, max_tokens=8, temperature=0, echo=True, logprobs=1
    )
    choice = echoed.choices[0]
    assert choice.text == prompt + plain_text
    ids = tokenizer.encode(prompt)
    assert choice.logprobs is not None
    assert choice.logprobs.token_logprobs is not None
    first: object = choice.logprobs.token_logprobs[0]
    assert first is None
    forward = _log_softmax(plain.all_logits(ids))
    for j in range(1, len(ids)):
        assert choice.logprobs.token_logprobs[j] == pytest.approx(forward[j - 1][ids[j]], abs=1e-4)


@pytest.mark.parametrize("stream", [False, True])
def test_echo_with_max_tokens_0_scores_the_prompt_and_generates_nothing(
    client: openai.OpenAI, plain: PlainDecoder, tokenizer: HFTokenizer, stream: bool
) -> None:
    """How evaluation harnesses (lm-eval's loglikelihood) score a text: the prompt's logprobs, no tokens."""
    prompt = PROMPTS[3]
    ids = tokenizer.encode(prompt)
    forward = _log_softmax(plain.all_logits(ids))
    expected = [None, *(pytest.approx(forward[j - 1][ids[j]], abs=1e-4) for j in range(1, len(ids)))]
    kwargs: dict[str, Any] = {"model": "tiny", "prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 0}
    if stream:
        chunks = list(
            client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True})
        )
        choices = [c.choices[0] for c in chunks if c.choices]
        text = "".join(c.text for c in choices)
        scored = [x for c in choices if c.logprobs for x in c.logprobs.token_logprobs or []]
        finish, usage = choices[-1].finish_reason, chunks[-1].usage
    else:
        result = client.completions.create(**kwargs)
        assert result.choices[0].logprobs is not None
        text, scored = result.choices[0].text, list(result.choices[0].logprobs.token_logprobs or [])
        finish, usage = result.choices[0].finish_reason, result.usage
    assert text == prompt
    assert scored == expected
    assert finish == "length"
    assert usage is not None
    assert (usage.prompt_tokens, usage.completion_tokens) == (len(ids), 0)


def test_max_tokens_0_without_echo_is_refused(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=0)
    assert info.value.body["param"] == "max_tokens"  # type: ignore[index]
    assert "0 only with echo" in info.value.body["message"]  # type: ignore[index]


@pytest.mark.parametrize(
    "penalties",
    [
        Penalties(presence=1.5),
        Penalties(frequency=0.8),
        Penalties(repetition=1.3),
        Penalties(presence=0.5, frequency=0.5, repetition=1.1, bias={7: 2.0, 11: -1.0}),
    ],
)
def test_greedy_output_with_penalties_equals_plain_greedy_decoding_with_them(
    client: openai.OpenAI, plain: PlainDecoder, tokenizer: HFTokenizer, penalties: Penalties
) -> None:
    for prompt in PROMPTS[:2]:
        ids = tokenizer.encode(prompt)
        result = client.completions.create(
            model="tiny",
            prompt=ids,
            max_tokens=MAX_TOKENS,
            temperature=0,
            presence_penalty=penalties.presence,
            frequency_penalty=penalties.frequency,
            logit_bias={str(k): int(v) for k, v in penalties.bias.items()},
            logprobs=0,
            extra_body={"repetition_penalty": penalties.repetition},
        )
        expected = plain.greedy(ids, MAX_TOKENS, penalties)
        assert result.choices[0].text == tokenizer.decode(expected)
        unpenalised = plain.greedy(ids, MAX_TOKENS)
        assert expected != unpenalised  # the penalty did change the output


def test_a_large_logit_bias_makes_a_token_certain(client: openai.OpenAI, tokenizer: HFTokenizer) -> None:
    token = tokenizer.encode(" kernel", add_special_tokens=False)[0]
    result = client.completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=6, temperature=1.0, seed=2, logit_bias={str(token): 100}
    )
    assert result.choices[0].text == tokenizer.decode([token] * 6)


def test_top_k_1_and_min_p_1_sample_the_greedy_output(client: openai.OpenAI) -> None:
    base: dict[str, Any] = {"model": "tiny", "prompt": PROMPTS[1], "max_tokens": MAX_TOKENS}
    greedy = client.completions.create(temperature=0, **base).choices[0].text
    top_k = client.completions.create(temperature=1.5, seed=4, extra_body={"top_k": 1}, **base)
    min_p = client.completions.create(temperature=1.5, seed=4, extra_body={"min_p": 1.0}, **base)
    free = client.completions.create(temperature=1.5, seed=4, **base)
    assert top_k.choices[0].text == greedy
    assert min_p.choices[0].text == greedy
    assert free.choices[0].text != greedy


WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}
TIME: Any = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
    },
}


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_required_or_named_tool_call_comes_back_as_tool_calls(
    client: openai.OpenAI, tool_choice: Any
) -> None:
    result = client.chat.completions.create(
        model="tiny",
        messages=[{"role": "user", "content": "weather in paris?"}],
        max_tokens=100,
        temperature=0,
        tools=[WEATHER, TIME],
        tool_choice=tool_choice,
    )
    choice = result.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    calls = choice.message.tool_calls
    assert calls is not None
    assert len(calls) == 1
    call = calls[0]
    assert call.type == "function"
    assert call.function.name in ("get_weather", "get_time")
    if not isinstance(tool_choice, str):
        assert call.function.name == "get_weather"
    schema = (WEATHER if call.function.name == "get_weather" else TIME)["function"]["parameters"]
    jsonschema.validate(json.loads(call.function.arguments), schema)


def test_a_streamed_tool_call_arrives_incrementally_as_openai_streams_it(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "weather?"}],
        "max_tokens": 100,
        "temperature": 0,
        "tools": [WEATHER],
        "tool_choice": "required",
    }
    whole = client.chat.completions.create(**kwargs)
    whole_calls = whole.choices[0].message.tool_calls
    assert whole_calls is not None
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert len(deltas) > 2  # the arguments arrive in fragments, as they are generated
    first, *rest = deltas
    assert first.id is not None
    assert first.type == "function"
    assert first.function is not None
    assert first.function.name == "get_weather"
    assert first.function.arguments == ""
    assert all(d.id is None and d.function is not None and d.function.name is None for d in rest)
    arguments = "".join(d.function.arguments or "" for d in rest if d.function is not None)
    assert arguments == whole_calls[0].function.arguments
    jsonschema.validate(json.loads(arguments), WEATHER["function"]["parameters"])
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("cut", ["name", "arguments"])
def test_a_forced_tool_call_cut_by_max_tokens_is_still_a_call_with_finish_reason_length(
    client: openai.OpenAI, stream: bool, cut: str
) -> None:
    kwargs: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "weather?"}],
        "temperature": 0,
        "tools": [WEATHER],
        "tool_choice": "required",
    }
    whole = client.chat.completions.create(**kwargs, max_tokens=100)
    full = whole.choices[0].message.tool_calls
    assert full is not None
    assert whole.usage is not None
    kwargs["max_tokens"] = 4 if cut == "name" else whole.usage.completion_tokens - 3
    if stream:
        chunks = list(client.chat.completions.create(**kwargs, stream=True))
        deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
        assert deltas[0].function is not None
        name = deltas[0].function.name
        arguments = "".join(d.function.arguments or "" for d in deltas if d.function is not None)
        finish = chunks[-1].choices[0].finish_reason
        assert all(c.choices[0].delta.content in (None, "") for c in chunks if c.choices)
    else:
        choice = client.chat.completions.create(**kwargs).choices[0]
        assert choice.message.content is None
        assert choice.message.tool_calls is not None
        name = choice.message.tool_calls[0].function.name
        arguments = choice.message.tool_calls[0].function.arguments
        finish = choice.finish_reason
    assert finish == "length"
    assert name == "get_weather"
    assert full[0].function.arguments.startswith(arguments)
    assert len(arguments) < len(full[0].function.arguments)
    assert (arguments == "") == (cut == "name")


def test_a_streamed_tool_call_carries_the_logprobs_of_all_its_tokens(client: openai.OpenAI) -> None:
    kwargs: dict[str, Any] = {
        "model": "tiny",
        "messages": [{"role": "user", "content": "weather?"}],
        "max_tokens": 100,
        "temperature": 0,
        "tools": [WEATHER],
        "tool_choice": "required",
        "logprobs": True,
    }
    whole = client.chat.completions.create(**kwargs)
    assert whole.choices[0].logprobs is not None
    assert whole.usage is not None
    expected = [item.token for item in whole.choices[0].logprobs.content or []]
    assert len(expected) == whole.usage.completion_tokens
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = [
        item.token
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for item in c.choices[0].logprobs.content or []
    ]
    assert streamed == expected


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tools": [WEATHER]}, "tool_choice"),  # auto (the default) needs a model's tool-call format
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
        ),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format"),
        (
            {"response_format": {"type": "lark_grammar", "lark_grammar": "start: undefined_rule"}},
            "response_format",
        ),
        ({"logit_bias": {"999999": 1.0}}, "logit_bias"),
        ({"tool_choice": "required"}, "tool_choice"),  # no tools to call
        ({"top_logprobs": 2}, "top_logprobs"),  # without logprobs
        ({"stream_options": {"include_usage": True}}, "stream_options"),  # without stream
    ],
)
def test_what_cannot_be_honoured_is_a_bad_request_naming_the_field(
    client: openai.OpenAI, kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4, **kwargs
        )
    assert info.value.body["param"] == field  # type: ignore[index]


@pytest.mark.parametrize(("field", "value"), [("best_of", 2), ("suffix", "end")])
def test_completion_options_still_refused_name_the_field(
    client: openai.OpenAI, field: str, value: Any
) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=1, **{field: value})
    assert info.value.body["param"] == field  # type: ignore[index]
