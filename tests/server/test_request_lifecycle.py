"""The request lifecycle rules one by one: release only between steps, error attribution, a stream that never
started, the length pre-check, tokenisation off the event loop, per-step speculation metrics."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from collections.abc import Sequence
from typing import Any

import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.api.errors import BadRequestError
from specdeploy_server.api.protocol import ChatCompletionRequest, CompletionRequest
from specdeploy_server.api.serving import OFFLOAD_CHARS, OpenAIServing, ServingSettings
from specdeploy_server.backends.standin import CharTokenizer, standin_engine
from specdeploy_server.core.executors import ExecutorError, RequestErrors, VerifyRequest
from specdeploy_server.core.scheduler import SchedulerSettings, StepSpeculation
from specdeploy_server.core.types import FinishReason, RequestState, SamplingParams
from specdeploy_server.engine import Engine, EngineClient
from specdeploy_server.metrics import ServerMetrics

from tests.server.trtllm_double import DoubleState, trtllm_double

__all__ = ["trtllm_double"]

GREEDY = SamplingParams(temperature=0.0)


async def _tokens(engine: Engine, max_tokens: int, prompt: list[int] | None = None) -> list[int]:
    gen = engine.generate(prompt or [97], max_tokens, GREEDY)
    return [t async for out in gen.outputs for t in out.token_ids]


def test_an_abort_mid_step_releases_the_request_only_after_that_step() -> None:
    async def main() -> None:
        engine, target = standin_engine(0.0, None, alpha=0.0, settings=SchedulerSettings(draft_len=0))
        gate = asyncio.Event()
        in_verify = asyncio.Event()
        original = target.verify

        async def held(batch: Sequence[VerifyRequest]) -> list[list[int]]:
            in_verify.set()
            await gate.wait()
            return await original(batch)

        target.verify = held  # type: ignore[method-assign]
        await engine.start()
        gen = engine.generate([97], 50, GREEDY)
        other = asyncio.ensure_future(_tokens(engine, 5))
        await in_verify.wait()
        seq = engine.scheduler.running[0]
        await gen.close()  # the client goes away while the step that includes it is in flight
        assert seq.state is RequestState.ABORTED
        assert engine.queue_depth == 1  # no longer load at once ...
        assert target.released == set()  # ... but its state stays until the step has returned
        gate.set()
        assert len(await other) == 5
        assert seq.request_id in target.released
        await engine.stop(1)

    asyncio.run(main())


def test_a_request_error_fails_only_the_request_it_names(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        engine, target = standin_engine(0.001, None, alpha=0.0, settings=SchedulerSettings(draft_len=0))
        original = target.verify

        async def poisoned(batch: Sequence[VerifyRequest]) -> list[list[int]]:
            bad = {r.seq.request_id for r in batch if r.seq.prompt_ids == [0x2620]}
            if bad:
                raise RequestErrors({rid: ExecutorError("target", "poisoned prompt") for rid in bad})
            return await original(batch)

        target.verify = poisoned  # type: ignore[method-assign]
        await engine.start()
        results = await asyncio.gather(
            _tokens(engine, 8), _tokens(engine, 8, [0x2620]), _tokens(engine, 12), return_exceptions=True
        )
        await engine.stop(1)
        assert [len(r) if isinstance(r, list) else type(r) for r in results] == [8, ExecutorError, 12]
        assert engine.stats.requests_failed == 1

    with caplog.at_level(logging.WARNING):
        asyncio.run(main())
    assert any("verify" in r.getMessage() and "failed 1 request" in r.getMessage() for r in caplog.records)


def test_an_unattributable_fault_fails_only_the_running_requests_of_its_step(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        settings = SchedulerSettings(draft_len=0, max_batch_size=2)
        engine, target = standin_engine(0.001, None, alpha=0.0, settings=settings)
        original = target.verify
        calls = {"n": 0}

        async def flaky(batch: Sequence[VerifyRequest]) -> list[list[int]]:
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("device lost")
            return await original(batch)

        target.verify = flaky  # type: ignore[method-assign]
        await engine.start()
        results = await asyncio.gather(
            *(_tokens(engine, 20) for _ in range(2)), _tokens(engine, 4), return_exceptions=True
        )
        await engine.stop(1)
        # the two running at the failed step fail; the waiting one was not part of it and completes
        assert [type(r) if isinstance(r, BaseException) else len(r) for r in results] == [
            RuntimeError,
            RuntimeError,
            4,
        ]

    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    messages = [r.getMessage() for r in caplog.records]
    assert any("step 2 (verify" in m and "cannot be attributed" in m for m in messages), messages


def test_the_reference_backend_attributes_a_failed_forward_to_its_request(tiny_models: Any) -> None:
    from specdeploy_server.backends.factory import build_engine
    from specdeploy_server.backends.reference import ReferenceTargetExecutor
    from specdeploy_server.config import ServerConfig

    config = {
        "model": {"target": str(tiny_models.target), "draft": str(tiny_models.draft_unrelated)},
        "speculative": {"draftLen": 3},
        "placement": {"device": "cpu"},
    }
    engine = build_engine(ServerConfig.model_validate(config))
    assert isinstance(engine, Engine)
    target = engine.scheduler.target
    assert isinstance(target, ReferenceTargetExecutor)
    poison = engine.tokenizer.encode("kubernetes operator pod")
    original = target.model.model.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        # the target's forward fails whenever the poisoned prompt is in its input, batched with others or not
        if any(row[: len(poison)].tolist() == poison for row in kwargs["input_ids"]):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return original(*args, **kwargs)

    target.model.model.forward = forward

    async def main() -> list[Any]:
        await engine.start()
        prompts = [engine.tokenizer.encode("hello world"), poison, engine.tokenizer.encode("the draft")]
        results = await asyncio.gather(*(_tokens(engine, 6, p) for p in prompts), return_exceptions=True)
        await engine.stop(5)
        return list(results)

    results = asyncio.run(main())
    assert isinstance(results[1], ExecutorError)
    assert "reference target executor" in str(results[1])
    assert "illegal memory access" in str(results[1])
    assert [len(results[0]), len(results[2])] == [6, 6]


async def _asgi_call(app: Any, body: dict[str, Any]) -> None:
    """One POST /v1/completions through the ASGI interface (spec 2.4, where a server reports a client that
    has gone by raising ``OSError`` from ``send``) whose client is gone before the response starts."""
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}
    ]

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        raise OSError("the client has gone")

    scope = {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/completions",
        "raw_path": b"/v1/completions",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
    }
    with contextlib.suppress(Exception):  # Starlette reports the disconnect as ClientDisconnect
        await app(scope, receive, send)


def _never_read(engine: EngineClient, model: str) -> None:
    app = create_app(engine, served_model_name=model)

    async def main() -> None:
        await engine.start()
        body = {"model": model, "prompt": [5, 6, 7], "max_tokens": 100, "stream": True}
        await _asgi_call(app, body)
        assert engine.queue_depth == 0
        await engine.stop(1)

    asyncio.run(main())


def test_a_stream_whose_client_left_before_the_first_byte_frees_its_request() -> None:
    engine, _ = standin_engine(0.002, None, alpha=0.0, settings=SchedulerSettings(draft_len=0))
    _never_read(engine, "standin")


def test_the_same_with_the_llm_api_backend(tiny_models: Any, trtllm_double: DoubleState) -> None:
    from specdeploy_server.backends.factory import build_engine
    from specdeploy_server.config import ServerConfig

    config = {"model": {"target": str(tiny_models.target)}, "backend": "trtllm-llmapi"}
    _never_read(build_engine(ServerConfig.model_validate({**config, "speculative": {"method": "none"}})), "m")


class _RecordingTokenizer(CharTokenizer):
    def __init__(self) -> None:
        self.threads: list[str] = []

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        self.threads.append(threading.current_thread().name)
        return super().encode(text, add_special_tokens)


def _serving(max_model_len: int) -> tuple[OpenAIServing, _RecordingTokenizer]:
    engine, _ = standin_engine(0.0, None, 0.0, SchedulerSettings(max_model_len=max_model_len, draft_len=0))
    tokenizer = _RecordingTokenizer()
    engine.tokenizer = tokenizer
    return OpenAIServing(engine, ServingSettings("standin"), ServerMetrics("standin")), tokenizer


def test_a_prompt_that_cannot_fit_the_context_is_refused_before_tokenising() -> None:
    serving, tokenizer = _serving(max_model_len=1000)
    huge = "x" * 200_000
    with pytest.raises(BadRequestError) as completion:
        asyncio.run(serving.prepare_completion(CompletionRequest(model="standin", prompt=huge)))
    chat = ChatCompletionRequest.model_validate(
        {"model": "standin", "messages": [{"role": "user", "content": huge}]}
    )
    with pytest.raises(BadRequestError) as chatted:
        asyncio.run(serving.prepare_chat(chat))
    assert tokenizer.threads == []  # never tokenised
    assert (completion.value.param, chatted.value.param) == ("prompt", "messages")
    assert completion.value.code == "context_length_exceeded"
    assert "maximum context length is 1000 tokens" in completion.value.message


def test_long_prompts_are_tokenised_off_the_event_loop() -> None:
    serving, tokenizer = _serving(max_model_len=100_000)
    short = asyncio.run(serving.prepare_completion(CompletionRequest(model="standin", prompt="hello")))
    long = asyncio.run(
        serving.prepare_completion(CompletionRequest(model="standin", prompt="y" * (OFFLOAD_CHARS + 1)))
    )
    assert (len(short.prompt_ids), len(long.prompt_ids)) == (5, OFFLOAD_CHARS + 1)
    assert tokenizer.threads[0] == threading.main_thread().name
    assert tokenizer.threads[1].startswith("tokenizer")


def test_speculation_metrics_are_aggregated_per_step() -> None:
    metrics = ServerMetrics("m")
    metrics.on_speculation(StepSpeculation(3, 8, 5, [1, 0, 0, 1, 0, 1]))  # accepted 0, 3 and 5
    metrics.on_speculation(StepSpeculation(1, 0, 0, [0]))  # a step that drafted nothing
    value = metrics.registry.get_sample_value
    assert value("specdeploy_speculative_steps_total", {"model": "m"}) == 4
    assert value("specdeploy_draft_tokens_total", {"model": "m"}) == 8
    assert value("specdeploy_accepted_draft_tokens_total", {"model": "m"}) == 5
    assert value("specdeploy_accepted_length_bucket", {"model": "m", "le": "0.0"}) == 1
    assert value("specdeploy_accepted_length_bucket", {"model": "m", "le": "3.0"}) == 2
    assert value("specdeploy_accepted_length_bucket", {"model": "m", "le": "+Inf"}) == 3
    assert value("specdeploy_accepted_length_sum", {"model": "m"}) == 8
    assert value("specdeploy_accepted_length_count", {"model": "m"}) == 3


def test_the_draft_length_in_use_and_the_steps_that_speculated_are_exported() -> None:
    metrics = ServerMetrics("m")
    value = metrics.registry.get_sample_value
    metrics.on_speculation(StepSpeculation(4, 10, 6, [1, 0, 1, 0, 1]))  # 3 of 4 sequences drafted 10 tokens
    assert value("specdeploy_draft_length", {"model": "m"}) == 2.5
    assert value("specdeploy_speculating_steps_total", {"model": "m"}) == 3
    metrics.on_speculation(StepSpeculation(2, 0, 0, [0]))  # under load: nobody drafted
    assert value("specdeploy_draft_length", {"model": "m"}) == 0
    assert value("specdeploy_speculating_steps_total", {"model": "m"}) == 3
    assert value("specdeploy_speculative_steps_total", {"model": "m"}) == 6


def test_a_finished_request_is_finished() -> None:
    async def main() -> None:
        engine, _ = standin_engine(0.0, None, alpha=0.0, settings=SchedulerSettings(draft_len=0))
        await engine.start()
        gen = engine.generate([97], 3, GREEDY)
        outs = [out async for out in gen.outputs]
        assert outs[-1].finish_reason == FinishReason.LENGTH
        await engine.stop(1)
        assert engine.stats.requests_finished == 1

    asyncio.run(main())
