"""Cancellation in backend trtllm-engine, through the TensorRT-LLM test double
(tests/server/trtllm_double.py): a client that goes away cancels its executor requests; only requests still
in flight are cancelled, and nothing is once the executor is shut down."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.backends.trtllm_executor_client import Outcome
from specdeploy_server.backends.trtllm_executors import TrtTargetExecutor
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.types import SamplingParams, SequenceState
from specdeploy_server.engine import Engine
from specdeploy_testkit import sample_text

from tests.server.conftest import TinyModels
from tests.server.trtllm_double import DoubleState, engines_config, trtllm_double

__all__ = ["trtllm_double"]

PROMPT = sample_text.prompts(1, seed=11)[0]


def test_a_client_that_goes_away_cancels_its_executor_requests(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    config = engines_config(tmp_path, tiny_models.target, trtllm_double, tiny_models.draft_unrelated)
    trtllm_double.request_delay = 5.0  # each executor request runs until cancelled or this long

    async def within(seconds: float, condition: Callable[[], bool]) -> bool:
        deadline = time.monotonic() + seconds
        while not condition() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        return condition()

    async def main() -> None:
        engine = build_engine(ServerConfig.model_validate(config))
        assert isinstance(engine, Engine)
        await engine.start()
        gen = engine.generate(engine.tokenizer.encode(PROMPT), 200, SamplingParams(temperature=0.0))
        step = asyncio.ensure_future(anext(gen.outputs))
        # the first draft request is in flight
        assert await within(10, lambda: any(e._next_id > 1 for e in trtllm_double.executors)), (
            "no draft request in flight"
        )
        step.cancel()  # what the HTTP layer does when the client disconnects
        with contextlib.suppress(asyncio.CancelledError):
            await step
        assert await within(10, lambda: bool(trtllm_double.cancelled)), "no executor request was cancelled"
        assert await within(10, lambda: not engine.scheduler.running), "the request released"
        await engine.stop(1)

    asyncio.run(main())


def test_only_requests_in_flight_are_cancelled(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    """A sequence whose executor request already finished is not cancelled (the executor would only log
    "Ignoring already terminated request"); one still running is, and ends CANCELLED."""
    engine = build_engine(
        ServerConfig.model_validate(engines_config(tmp_path, tiny_models.target, trtllm_double, None))
    )
    assert isinstance(engine, Engine)
    target = engine.scheduler.target
    assert isinstance(target, TrtTargetExecutor)
    client, factory = target.client, target.requests
    (executor,) = trtllm_double.executors
    trtllm_double.request_delay = 0.3
    prompt = engine.tokenizer.encode(PROMPT)
    seqs = [SequenceState(name, prompt, 4, SamplingParams(temperature=0.0)) for name in ("a", "b")]

    async def main() -> list[Outcome]:
        step = asyncio.ensure_future(
            client.run([(s.request_id, factory.request(s, 2, greedy=True)) for s in seqs])
        )
        while not executor._terminated:  # "a" is answered; "b" still runs
            await asyncio.sleep(0.01)
        trtllm_double.request_delay = 60.0  # "b" runs until cancelled
        deadline = time.monotonic() + 10
        while 1 in client._pending and time.monotonic() < deadline:  # the answer reaches the event loop
            await asyncio.sleep(0.005)
        client.cancel("a")
        assert trtllm_double.ignored_cancels == []
        assert trtllm_double.cancelled == []
        client.cancel("b")
        return await step

    done, cancelled = asyncio.run(main())
    assert (done.cancelled, done.finish, len(done.tokens)) == (False, "LENGTH", 2)
    assert (cancelled.cancelled, cancelled.finish, cancelled.tokens) == (True, "CANCELLED", [])
    assert trtllm_double.cancelled == trtllm_double.cancelled_in_flight == [2]
    assert trtllm_double.ignored_cancels == []
    asyncio.run(engine.stop(1))


def test_nothing_is_cancelled_after_shutdown(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    """A step given up after its executor was shut down does not call cancel_request (which would throw
    "Shutdown called" out of the step)."""
    engine = build_engine(
        ServerConfig.model_validate(engines_config(tmp_path, tiny_models.target, trtllm_double, None))
    )
    assert isinstance(engine, Engine)
    target = engine.scheduler.target
    assert isinstance(target, TrtTargetExecutor)
    trtllm_double.request_delay = 0.3
    seq = SequenceState("a", engine.tokenizer.encode(PROMPT), 4, SamplingParams(temperature=0.0))

    async def main() -> None:
        step = asyncio.ensure_future(target.client.run([("a", target.requests.request(seq, 2, greedy=True))]))
        await asyncio.sleep(0.05)
        target.client.close()
        target.release("a")
        step.cancel()
        with pytest.raises(asyncio.CancelledError):
            await step

    asyncio.run(main())
    assert trtllm_double.cancelled == []
