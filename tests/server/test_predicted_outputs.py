"""Predicted Outputs through the official openai client against a live server (reference backend): greedy
output identical with and without a prediction over many edit patterns, usage details consistent with the
emitted tokens, streaming, n = 2, limits and the per-request speculation control."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.tokenizer import HFTokenizer

from tests.server.conftest import LiveServer, TinyModels, run_live
from tests.server.plain_decoding import PlainDecoder

PROMPTS = ["the draft model", "a target verifies", "speculative decoding of", "once upon a time"]
MAX_TOKENS = 40
DEPLOYMENTS = {
    "draft-model-auto": {"method": "draftTarget", "draftLen": "auto"},
    "none": {"method": "none"},
    "prompt-lookup": {"method": "promptLookup", "draftLen": 3},
}


@pytest.fixture(scope="module", params=sorted(DEPLOYMENTS))
def server(request: pytest.FixtureRequest, tiny_models: TinyModels) -> Iterator[LiveServer]:
    config = ServerConfig.model_validate(
        {
            "model": {
                "target": str(tiny_models.target),
                "draft": str(tiny_models.draft_unrelated),
                "servedModelName": "tiny",
            },
            "speculative": DEPLOYMENTS[request.param],
            "placement": {"device": "cpu"},
        }
    )
    app = create_app(build_engine(config), served_model_name=config.model.name)
    with run_live(app) as live:
        yield live


@pytest.fixture(scope="module")
def plain_decoder(tiny_models: TinyModels) -> PlainDecoder:
    return PlainDecoder(tiny_models.target)


@pytest.fixture(scope="module")
def tokenizer(tiny_models: TinyModels) -> HFTokenizer:
    return HFTokenizer(tiny_models.target)


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def _complete(client: openai.OpenAI, prompt: str, prediction: str | None = None, **kw: Any) -> Any:
    extra: dict[str, Any] = (
        {"prediction": {"type": "content", "content": prediction}} if prediction is not None else {}
    )
    extra.update(kw.pop("extra_body", {}))
    args: dict[str, Any] = {"model": "tiny", "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0}
    args.update(kw)
    return client.completions.create(**args, extra_body=extra or None)


def _edits(tokens: list[int], rng: random.Random, vocab: int) -> dict[str, list[int]]:
    """Edited copies of ``tokens``: the kinds of change a rewrite makes."""
    n = len(tokens)
    at = rng.randrange(1, max(n - 1, 2))
    span = rng.randint(1, 4)
    fresh = [rng.randrange(3, vocab) for _ in range(span)]
    replaced = list(tokens)
    for i in rng.sample(range(n), max(1, n // 10)):
        replaced[i] = rng.randrange(3, vocab)
    return {
        "exact": list(tokens),
        "replace-one": [*tokens[:at], rng.randrange(3, vocab), *tokens[at + 1 :]],
        "replace-ten-percent": replaced,
        "insert": tokens[:at] + fresh + tokens[at:],
        "delete": tokens[:at] + tokens[at + span :],
        "replace-span": tokens[:at] + fresh + tokens[at + span :],
        "prefix-only": tokens[: n // 2],
        "suffix-only": tokens[n // 2 :],
        "doubled": tokens + tokens,
        "unrelated": [rng.randrange(3, vocab) for _ in range(n)],
        "empty": [],
    }


def _common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_greedy_output_is_identical_with_any_prediction(
    client: openai.OpenAI, tokenizer: HFTokenizer, plain_decoder: PlainDecoder
) -> None:
    decoder = plain_decoder
    rng = random.Random(0)
    vocab = len(tokenizer.hf)
    used = 0
    for prompt in PROMPTS:
        plain = _complete(client, prompt)
        text = plain.choices[0].text
        generated = decoder.greedy(tokenizer.encode(prompt), MAX_TOKENS)
        assert tokenizer.decode(generated) == text  # the server decodes as plain decoding does
        # the prediction is text, tokenised again: only where that gives the generated tokens can it match
        # (a random-weight model's output is rarely the canonical tokenisation of its text)
        tokens = tokenizer.encode(text, add_special_tokens=False)
        canonical = _common_prefix(tokens, generated)
        for kind, edited in _edits(tokens, rng, vocab).items():
            prediction = tokenizer.decode(edited)
            got = _complete(client, prompt, prediction)
            assert got.choices[0].text == text, (prompt, kind)
            assert got.choices[0].finish_reason == plain.choices[0].finish_reason
            assert got.usage.completion_tokens == plain.usage.completion_tokens
            details = got.usage.completion_tokens_details
            predicted = len(tokenizer.encode(prediction, add_special_tokens=False))
            assert details.accepted_prediction_tokens <= got.usage.completion_tokens
            assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == predicted
            used += details.accepted_prediction_tokens
            if kind == "exact":
                # the canonical run is drafted in a few growing drafts, each step adding one own token
                assert details.accepted_prediction_tokens >= min(canonical, len(generated) - 1) - 4
    assert used > 0


def test_chat_prediction_as_text_parts_gives_the_same_reply(client: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "hello world"}]
    plain = client.chat.completions.create(model="tiny", messages=messages, max_tokens=30, temperature=0)
    reply = plain.choices[0].message.content or ""
    half = len(reply) // 2
    predicted = client.chat.completions.create(
        model="tiny",
        messages=messages,
        max_tokens=30,
        temperature=0,
        prediction={
            "type": "content",
            "content": [{"type": "text", "text": reply[:half]}, {"type": "text", "text": reply[half:]}],
        },
    )
    assert predicted.choices[0].message.content == reply
    assert predicted.usage is not None
    assert predicted.usage.completion_tokens_details is not None
    if plain.usage is not None and plain.usage.completion_tokens > 2:
        assert (predicted.usage.completion_tokens_details.accepted_prediction_tokens or 0) > 0
    assert plain.usage is not None
    assert plain.usage.completion_tokens_details is None


def test_streamed_prediction_matches_and_reports_usage_in_the_last_chunk(client: openai.OpenAI) -> None:
    prompt = PROMPTS[0]
    whole = _complete(client, prompt, None)
    text = whole.choices[0].text
    chunks = list(_complete(client, prompt, text, stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == whole.usage.completion_tokens
    # how much is accepted depends on how the steps fell (timing, with plain multi-step decoding), not the
    # invariants: every prediction token is accepted or rejected, and accepted ones are completion tokens
    details = usage.completion_tokens_details
    again = _complete(client, prompt, text).usage.completion_tokens_details
    assert details is not None
    assert details.accepted_prediction_tokens <= usage.completion_tokens
    total = details.accepted_prediction_tokens + details.rejected_prediction_tokens
    assert total == again.accepted_prediction_tokens + again.rejected_prediction_tokens


def test_usage_sums_the_choices_of_n_and_stops_cut_accepted_tokens(
    client: openai.OpenAI, tokenizer: HFTokenizer
) -> None:
    prompt = PROMPTS[1]
    text = _complete(client, prompt).choices[0].text
    predicted = len(tokenizer.encode(text, add_special_tokens=False))
    two = _complete(client, prompt, text, n=2)
    assert [c.text for c in two.choices] == [text, text]
    details = two.usage.completion_tokens_details
    # each choice accounts the whole prediction on its own
    assert details.accepted_prediction_tokens + details.rejected_prediction_tokens == 2 * predicted
    assert details.accepted_prediction_tokens <= two.usage.completion_tokens
    # a stop string inside a long accepted run: only the kept tokens count as accepted
    words = text.split()
    if len(words) > 4:
        stop = words[3]
        cut = _complete(client, prompt, text, stop=[stop])
        assert cut.choices[0].text == _complete(client, prompt, stop=[stop]).choices[0].text
        cut_details = cut.usage.completion_tokens_details
        assert cut_details.accepted_prediction_tokens <= cut.usage.completion_tokens


def test_a_prediction_composes_with_logprobs_penalties_and_logit_bias(client: openai.OpenAI) -> None:
    prompt = PROMPTS[2]
    kw: dict[str, Any] = {
        "logprobs": 2,
        "frequency_penalty": 0.5,
        "presence_penalty": 0.3,
        "logit_bias": {"5": 3.0},
    }
    plain = _complete(client, prompt, **kw)
    predicted = _complete(client, prompt, plain.choices[0].text, **kw)
    assert predicted.choices[0].text == plain.choices[0].text
    assert predicted.choices[0].logprobs.tokens == plain.choices[0].logprobs.tokens
    for a, b in zip(
        predicted.choices[0].logprobs.token_logprobs, plain.choices[0].logprobs.token_logprobs, strict=True
    ):
        assert a == pytest.approx(b, abs=1e-4)


def test_a_prediction_composes_with_structured_output(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    messages: Any = [{"role": "user", "content": "give json"}]
    plain = client.chat.completions.create(
        model="tiny", messages=messages, max_tokens=20, temperature=0, response_format=fmt
    )
    reply = plain.choices[0].message.content or ""
    for prediction in (reply, '{"a": 12345}', "not json at all"):
        got = client.chat.completions.create(
            model="tiny",
            messages=messages,
            max_tokens=20,
            temperature=0,
            response_format=fmt,
            prediction={"type": "content", "content": prediction},
        )
        assert got.choices[0].message.content == reply


def test_speculation_can_be_turned_off_or_capped_for_one_request(client: openai.OpenAI) -> None:
    prompt = PROMPTS[3]
    plain = _complete(client, prompt)
    text = plain.choices[0].text
    off = _complete(client, prompt, text, extra_body={"speculation": {"enabled": False}})
    assert off.choices[0].text == text
    assert off.speculative["draft_tokens"] == 0
    assert off.usage.completion_tokens_details.accepted_prediction_tokens == 0
    capped = _complete(client, prompt, text, extra_body={"speculation": {"max_draft_tokens": 2}})
    assert capped.choices[0].text == text
    spec = capped.speculative
    assert spec["draft_tokens"] <= 2 * spec["steps"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prediction": "text"}, "prediction"),
        ({"prediction": {"type": "file", "content": "x"}}, "prediction"),
        ({"prediction": {"type": "content"}}, "prediction"),
        ({"prediction": {"type": "content", "content": 5}}, "prediction"),
        ({"prediction": {"type": "content", "content": [{"type": "image", "text": "x"}]}}, "prediction"),
        ({"prediction": {"type": "content", "content": "x", "extra": 1}}, "prediction"),
        ({"speculation": {"max_draft_tokens": -1}}, "speculation"),
        ({"speculation": {"enabled": "no"}}, "speculation"),
        ({"speculation": {"draft": 3}}, "speculation"),
    ],
)
def test_a_malformed_prediction_or_speculation_is_refused_naming_the_field(
    client: openai.OpenAI, body: dict[str, Any], param: str
) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model="tiny", prompt="x", max_tokens=2, extra_body=body)
    assert err.value.body["param"] == param  # type: ignore[index]
    assert param in err.value.body["message"]  # type: ignore[index]


def test_an_oversized_prediction_is_refused_and_others_are_served(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        _complete(client, "x", "word " * 100_000, max_tokens=2)
    assert err.value.body["param"] == "prediction"  # type: ignore[index]
    assert err.value.body["code"] == "context_length_exceeded"  # type: ignore[index]
    assert _complete(client, PROMPTS[0], max_tokens=3).choices[0].text
