"""The step loop with stand-in executors: batching, limits, queueing, cancellation, faults, shutdown."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import pytest
from specdeploy_server.backends.standin import standin_engine
from specdeploy_server.core.executors import VerifyRequest
from specdeploy_server.core.scheduler import (
    EngineStoppedError,
    QueueFullError,
    SchedulerSettings,
    _truncate,
)
from specdeploy_server.core.types import FinishReason, SamplingParams, StepOutput
from specdeploy_server.engine import Engine

from benchmarks.server.orchestration import standin_overshoot
from tests.conftest import wait_for_async

GREEDY = SamplingParams(temperature=0.0)


async def _drain(engine: Engine, prompt: list[int], max_tokens: int) -> list[StepOutput]:
    gen = engine.generate(prompt, max_tokens, GREEDY)
    return [out async for out in gen.outputs]


def test_each_request_gets_exactly_max_tokens_and_a_length_finish() -> None:
    async def main() -> None:
        engine, _ = standin_engine(0.001, 0.0, alpha=0.8, settings=SchedulerSettings(draft_len=4))
        await engine.start()
        results = await asyncio.gather(*(_drain(engine, [97, 98], n) for n in (1, 2, 7, 30)))
        await engine.stop(1)
        for n, outs in zip((1, 2, 7, 30), results, strict=True):
            assert sum(len(o.token_ids) for o in outs) == n
            assert outs[-1].finish_reason == FinishReason.LENGTH
            assert all(o.finish_reason is None for o in outs[:-1])

    asyncio.run(main())


def test_concurrent_requests_share_each_verify_call() -> None:
    async def main() -> None:
        engine, target = standin_engine(0.005, None, alpha=0.0, settings=SchedulerSettings(draft_len=0))
        await engine.start()
        await asyncio.gather(*(_drain(engine, [97], 20) for _ in range(8)))
        await engine.stop(1)
        assert max(len(ids) for ids in target.seen) == 8
        assert target.calls < 8 * 20 / 2

    asyncio.run(main())


def test_a_context_length_limit_ends_generation() -> None:
    async def main() -> None:
        engine, _ = standin_engine(
            0.0, 0.0, alpha=1.0, settings=SchedulerSettings(draft_len=4, max_model_len=10)
        )
        await engine.start()
        outs = await _drain(engine, [97] * 6, 100)
        await engine.stop(1)
        assert sum(len(o.token_ids) for o in outs) == 4
        assert outs[-1].finish_reason == FinishReason.LENGTH

    asyncio.run(main())


def test_the_end_of_sequence_token_stops_and_is_the_last_token() -> None:
    async def main() -> None:
        engine, target = standin_engine(0.0, None, alpha=0.0, settings=SchedulerSettings(draft_len=0))
        target.vocab = [0]  # the character tokenizer's end-of-sequence id
        await engine.start()
        outs = await _drain(engine, [97], 50)
        await engine.stop(1)
        assert [o.token_ids for o in outs] == [[0]]
        assert outs[-1].finish_reason == FinishReason.STOP

    asyncio.run(main())


def test_a_full_queue_refuses_new_requests() -> None:
    async def main() -> None:
        settings = SchedulerSettings(max_batch_size=1, max_queue_size=1, draft_len=0)
        engine, _ = standin_engine(0.01, None, alpha=0.0, settings=settings)
        await engine.start()
        first = engine.generate([97], 50, GREEDY)
        second = engine.generate([97], 50, GREEDY)  # waits: one slot, one queue place
        await wait_for_async(
            lambda: (len(engine.scheduler.running), len(engine.scheduler.waiting)) == (1, 1),
            what="the first request in the batch slot, the second in the queue",
        )
        with pytest.raises(QueueFullError):
            engine.generate([97], 5, GREEDY)
        await first.outputs.aclose()
        await second.outputs.aclose()
        await engine.stop(1)

    asyncio.run(main())


def test_closing_a_stream_cancels_its_generation() -> None:
    async def main() -> None:
        engine, target = standin_engine(0.005, 0.001, alpha=0.5, settings=SchedulerSettings(draft_len=2))
        await engine.start()
        gen = engine.generate([97], 10_000, GREEDY)
        other = asyncio.ensure_future(_drain(engine, [98], 60))
        await anext(gen.outputs)
        await anext(gen.outputs)
        await gen.outputs.aclose()
        calls_at_close = target.calls
        await other
        ids_after = set().union(*target.seen[calls_at_close + 1 :])
        await engine.stop(1)
        assert len(engine.scheduler.running) == 0
        assert len(ids_after) == 1  # only the other request was still being verified
        assert len(target.released) == 2

    asyncio.run(main())


def test_a_backend_fault_fails_the_batch_but_not_the_server() -> None:
    async def main() -> None:
        engine, target = standin_engine(0.0, None, alpha=0.0, settings=SchedulerSettings(draft_len=0))
        original = target.verify
        calls = {"n": 0}

        async def flaky(batch: Sequence[VerifyRequest]) -> list[list[int]]:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("device lost")
            return await original(batch)

        target.verify = flaky  # type: ignore[method-assign]
        await engine.start()
        with pytest.raises(RuntimeError, match="device lost"):
            await _drain(engine, [97], 5)
        outs = await _drain(engine, [97], 5)
        await engine.stop(1)
        assert sum(len(o.token_ids) for o in outs) == 5

    asyncio.run(main())


def test_stop_finishes_in_flight_requests_within_the_grace_period_and_aborts_the_rest() -> None:
    async def main() -> None:
        engine, _ = standin_engine(0.002, None, alpha=0.0, settings=SchedulerSettings(draft_len=0))
        await engine.start()
        short = asyncio.ensure_future(_drain(engine, [97], 5))
        long = asyncio.ensure_future(_drain(engine, [97], 100_000))
        await wait_for_async(lambda: len(engine.scheduler.running) == 2, what="both requests in the batch")
        await engine.stop(0.3)
        assert (await short)[-1].finish_reason == FinishReason.LENGTH
        # aborted at the timeout: its 100000 steps would have ended it with `length`
        assert (await long)[-1].finish_reason == FinishReason.ABORT
        with pytest.raises(EngineStoppedError):
            engine.generate([97], 1, GREEDY)

    asyncio.run(main())


def test_standin_calls_are_never_early() -> None:
    """The stand-ins are a latency model: a call takes at least its nominal time (a timer, then a spin). That
    it takes no more is the server benchmark's to check (`orchestration.check_standins`): a timing."""

    async def main() -> None:
        for seconds in (0.0005, 0.003, 0.012):
            assert len(await standin_overshoot(seconds)) == 20  # raises on an early return

    asyncio.run(main())


def test_outputs_arrive_in_order_and_complete_with_many_concurrent_requests() -> None:
    """Outputs are handed over after the next executor call starts; none is lost, reordered or late."""

    async def main() -> None:
        engine, _ = standin_engine(
            0.002, 0.0005, alpha=0.6, settings=SchedulerSettings(draft_len=3, max_batch_size=16)
        )
        await engine.start()
        counts = [3, 17, 40, 1, 25] * 8
        results = await asyncio.gather(*(_drain(engine, [97, 98], n) for n in counts))
        await engine.stop(1)
        for n, outs in zip(counts, results, strict=True):
            assert sum(len(o.token_ids) for o in outs) == n
            assert [o.finish_reason for o in outs] == [None] * (len(outs) - 1) + [FinishReason.LENGTH]

    asyncio.run(main())


def test_a_follow_up_request_joins_the_next_step() -> None:
    """A consumer that submits a new request as soon as its previous one finished is in the next step."""

    async def main() -> None:
        engine, target = standin_engine(
            0.002, None, alpha=0.0, settings=SchedulerSettings(draft_len=0, max_batch_size=4)
        )
        await engine.start()

        async def background() -> None:
            await _drain(engine, [97], 30)

        async def chain() -> None:
            for _ in range(5):
                await _drain(engine, [97], 3)

        await asyncio.gather(background(), chain())
        await engine.stop(1)
        # 5 requests of 3 tokens at one token per step, back to back: 15 consecutive steps with two sequences
        pairs = [i for i, ids in enumerate(target.seen) if len(ids) == 2]
        assert len(pairs) == 15
        assert pairs[-1] - pairs[0] == 14

    asyncio.run(main())


@pytest.mark.parametrize(
    ("tokens", "room", "kept", "finish"),
    [
        ([5, 6, 7], 10, [5, 6, 7], None),
        ([5, 0, 7], 10, [5, 0], FinishReason.STOP),
        ([5, 0, 7], 2, [5, 0], FinishReason.STOP),  # the stop token is also the last allowed one
        ([5, 6, 0], 2, [5, 6], FinishReason.LENGTH),  # the limit comes before the stop token
        ([5, 6, 7], 3, [5, 6, 7], FinishReason.LENGTH),
        ([5, 6, 7], 1, [5], FinishReason.LENGTH),
        ([0], 1, [0], FinishReason.STOP),
    ],
)
def test_truncate_stops_at_the_first_stop_token_or_the_limit(
    tokens: list[int], room: int, kept: list[int], finish: FinishReason | None
) -> None:
    new = list(tokens)
    assert _truncate(new, frozenset({0}), room) == finish
    assert new == kept


def test_the_plan_search_is_not_timed_as_drafting(monkeypatch: pytest.MonkeyPatch) -> None:
    # The stand-in's draft pass takes 1 ms; the plan search is made to take 20 ms. Timed together, drafting
    # would look twenty times dearer than it is, and the longer drafts would never be chosen.
    async def main() -> None:
        engine, _ = standin_engine(0.004, 0.001, alpha=0.8, settings=SchedulerSettings(draft_len=None))
        controller = engine.scheduler.draft_len
        plan = controller.plan

        def slow_plan(request_ids: Sequence[str]) -> list[int]:
            time.sleep(0.02)
            return plan(request_ids)

        monkeypatch.setattr(controller, "plan", slow_plan)
        await engine.start()
        await _drain(engine, [97, 98], 60)
        await engine.stop(1)
        estimate = controller.draft_cost.estimator()
        assert controller.draft_cost.by_passes
        for passes in controller.draft_cost.by_passes:
            assert estimate(passes, 1) < passes * 0.001 + 0.010  # the plan search's 20 ms are not in it

    asyncio.run(main())


def test_a_requests_first_step_is_reported_as_feeding_its_prompt(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        engine, _ = standin_engine(0.001, 0.0005, alpha=0.8, settings=SchedulerSettings(draft_len=None))
        controller = engine.scheduler.draft_len
        seen: list[bool] = []
        observe = controller.observe_costs

        def record(*args: Any, prefills: bool = False) -> None:
            seen.append(prefills)
            observe(*args, prefills=prefills)

        monkeypatch.setattr(controller, "observe_costs", record)
        await engine.start()
        await _drain(engine, [97, 98], 12)
        await _drain(engine, [97, 99], 12)
        await engine.stop(1)
        assert seen[0] is True
        assert seen[1] is False
        assert seen.count(True) == 2  # each request's first step, and no other

    asyncio.run(main())
