"""SSE events of streamed completions and chats: one event per engine step (all of its tokens), written as
exactly the bytes ``json.dumps`` gives the event, whatever the text (quotes, backslashes, non-ASCII); a
step's inter-token latencies count as one observation per token."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, Histogram
from specdeploy_server.api.app import create_app
from specdeploy_server.api.contract import ChatCompletionChunk, CompletionChunk, body
from specdeploy_server.api.runs import LatencyTally
from specdeploy_server.api.streams import chat_text_choice, completion_text_choice, text_parts
from specdeploy_server.backends.standin import InstantEngine
from specdeploy_server.core.types import FinishReason, SeqStats, StepOutput

from tests.server.conftest import run_live

TEXT = 'a"b\\c\né€😀\tz</'


class _TextEngine(InstantEngine):
    """Emits TEXT's code points (the character tokenizer's ids), ``tokens_per_step`` per step."""

    async def _produce(self, max_tokens: int, stats: SeqStats) -> AsyncGenerator[StepOutput, None]:
        ids = [ord(c) for c in TEXT][:max_tokens]
        for start in range(0, len(ids), self.tokens_per_step):
            step = ids[start : start + self.tokens_per_step]
            finish = FinishReason.LENGTH if start + len(step) >= len(ids) else None
            yield StepOutput(step, finish, 0, 0)
            await asyncio.sleep(0)


def _events(base_url: str, path: str, body: dict[str, Any]) -> list[str]:
    with httpx.Client(base_url=base_url, timeout=10) as client:
        response = client.post(path, json={**body, "model": "instant", "stream": True})
        return [line[6:] for line in response.text.splitlines() if line.startswith("data: ")][:-1]


@pytest.mark.parametrize("per_step", [1, 4])
def test_each_step_is_one_event_serialised_as_json_dumps_would(per_step: int) -> None:
    app = create_app(_TextEngine(tokens_per_step=per_step), served_model_name="instant")
    with run_live(app) as live:
        completion = _events(live.base_url, "/v1/completions", {"prompt": "hi", "max_tokens": 64})
        chat = _events(
            live.base_url, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}
        )
    steps = -(-len(TEXT) // per_step)
    assert len(completion) == steps
    assert len(chat) == steps + 1  # the role comes first
    for event in completion + chat:
        assert event == json.dumps(json.loads(event), separators=(",", ":"))
    assert "".join(json.loads(e)["choices"][0]["text"] for e in completion) == TEXT
    assert "".join(json.loads(e)["choices"][0]["delta"].get("content", "") for e in chat) == TEXT
    finishes = [json.loads(e)["choices"][0]["finish_reason"] for e in completion]
    assert finishes == [None] * (steps - 1) + ["length"]


@pytest.mark.parametrize(
    "fields",
    [
        {"max_tokens": 64},
        {"max_tokens": 5, "n": 3},
        {"max_tokens": 64, "stream_options": {"include_usage": True}},
        {"max_tokens": 7, "n": 2, "stream_options": {"include_usage": True}},
        {"max_tokens": 3, "echo": True},
        {"max_tokens": 64, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        {"max_tokens": 7, "n": 2, "stream_options": {"include_usage": True, "continuous_usage_stats": True}},
        {
            "max_tokens": 3,
            "echo": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        },
    ],
)
def test_every_event_is_the_serialisation_of_its_contract_chunk(fields: dict[str, Any]) -> None:
    app = create_app(_TextEngine(tokens_per_step=2), served_model_name="instant")
    with run_live(app) as live:
        completion = _events(live.base_url, "/v1/completions", {"prompt": "hi", **fields})
        chat_fields = {k: v for k, v in fields.items() if k != "echo"}
        messages = [{"role": "user", "content": "hi"}]
        chat = _events(live.base_url, "/v1/chat/completions", {"messages": messages, **chat_fields})
    assert completion
    assert chat
    for events, chunk in ((completion, CompletionChunk), (chat, ChatCompletionChunk)):
        for event in events:
            model = chunk.model_validate_json(event)
            assert event == json.dumps(body(model), separators=(",", ":"))


@pytest.mark.parametrize("n", [1, 2])
def test_continuous_usage_puts_the_usage_so_far_in_every_chunk_and_the_total_in_the_last(n: int) -> None:
    app = create_app(_TextEngine(tokens_per_step=3), served_model_name="instant")
    both = {"include_usage": True, "continuous_usage_stats": True}
    with run_live(app) as live:
        streams = {
            path: [
                json.loads(e) for e in _events(live.base_url, path, {**extra, "n": n, "stream_options": both})
            ]
            for path, extra in (
                ("/v1/completions", {"prompt": "hi", "max_tokens": 64}),
                ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
            )
        }
        alone = {  # continuous_usage_stats without include_usage: as without either (vLLM's reading)
            path: [json.loads(e) for e in _events(live.base_url, path, {**extra, "stream_options": only})]
            for path, extra, only in (
                ("/v1/completions", {"prompt": "hi", "max_tokens": 64}, {"continuous_usage_stats": True}),
            )
        }
    for path, events in streams.items():
        usages = [e["usage"] for e in events]
        assert all(u["prompt_tokens"] == usages[0]["prompt_tokens"] > 0 for u in usages), path
        so_far = [u["completion_tokens"] for u in usages]
        assert so_far == sorted(so_far), path
        assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)
        assert events[-1]["choices"] == []
        assert so_far[-1] == n * len(TEXT), path  # the total, once every choice has finished
        assert so_far[-2] == so_far[-1]  # the last finish already counts every token
        texts = [c for e in events[:-1] for c in e["choices"]]
        assert texts, path
    plain = alone["/v1/completions"]
    assert [i for i, e in enumerate(plain) if "usage" in e] == [len(plain) - 1]  # with the finish only


@pytest.mark.parametrize("index", [0, 1, 15])
def test_text_only_choices_formatted_from_parts_equal_their_models_serialisation(index: int) -> None:
    for choice in (completion_text_choice, chat_text_choice):
        before, after = text_parts(choice, index)
        for text in (TEXT, "", "\x00text\x00", '"choices":[]', "\u2028\ud800"):
            whole = json.dumps(body(choice(index, text)), separators=(",", ":"))
            assert f"{before}{json.dumps(text)}{after}" == whole


def test_a_steps_latencies_are_counted_as_that_many_observations_once_flushed() -> None:
    registry_one, registry_many = CollectorRegistry(), CollectorRegistry()
    one = Histogram("itl", "x", buckets=(0.01, 0.1, 1.0), registry=registry_one)
    many = Histogram("itl", "x", buckets=(0.01, 0.1, 1.0), registry=registry_many)
    tally = LatencyTally(many)
    for value, times in ((0.005, 3), (0.01, 2), (0.05, 4), (0.5, 1), (5.0, 2)):
        tally.observe(value, times, 0.0)
        for _ in range(times):
            one.observe(value)
    assert registry_many.get_sample_value("itl_count") == 0  # counted in the request until flushed
    tally.flush()
    for le in ("0.01", "0.1", "1.0", "+Inf"):
        counted = registry_many.get_sample_value("itl_bucket", {"le": le})
        assert counted == registry_one.get_sample_value("itl_bucket", {"le": le})
    assert registry_many.get_sample_value("itl_count") == 12
    assert registry_many.get_sample_value("itl_sum") == pytest.approx(
        registry_one.get_sample_value("itl_sum")
    )
    tally.flush()  # nothing counted twice
    assert registry_many.get_sample_value("itl_count") == 12


def test_a_running_streams_latencies_reach_the_histogram_every_flush_interval() -> None:
    registry = CollectorRegistry()
    histogram = Histogram("itl", "x", buckets=(0.01, 0.1), registry=registry)
    tally = LatencyTally(histogram)
    start = time.perf_counter()
    tally.observe(0.05, 2, start)
    assert registry.get_sample_value("itl_count") == 0
    tally.observe(0.05, 1, start + LatencyTally.FLUSH_SECONDS + 0.01)
    assert registry.get_sample_value("itl_count") == 3
