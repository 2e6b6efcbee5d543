"""The step loop: admits requests, drafts and verifies all running sequences once per step, emits tokens.

One asyncio task drives every running sequence in lock step (iteration-level batching): each step makes one
batched ``propose`` call on the drafter and one batched ``verify`` call on the target executor. The loop never
blocks the event loop itself; executors run their work elsewhere (a thread, a GPU, TensorRT-LLM's executor).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from specdeploy_server.core.adaptive import DraftLenController
from specdeploy_server.core.drafters import Drafter
from specdeploy_server.core.executors import AcceptanceRule, RequestErrors, TargetExecutor, VerifyRequest
from specdeploy_server.core.load import ThroughputMeter
from specdeploy_server.core.types import FinishReason, Proposal, SequenceState, StepOutput

log = logging.getLogger(__name__)


class QueueFullError(Exception):
    """The waiting queue is at ``maxQueueSize``."""


class EngineStoppedError(Exception):
    """The scheduler is shutting down and takes no new requests."""


@dataclass(frozen=True)
class SchedulerSettings:
    max_batch_size: int = 64
    max_queue_size: int | None = 1024  # waiting (not yet running) requests; None = unbounded
    max_model_len: int = 4096
    acceptance: str = AcceptanceRule.TOKEN_MATCH
    draft_len: int | None = 4  # None = adaptive
    max_draft_len: int = 10
    #: busy seconds the measured generation rate averages over (see ThroughputMeter)
    rate_window_seconds: float = 10.0


class SchedulerObserver(Protocol):
    """Receives statistics as they happen (the metrics module implements it)."""

    def on_step(self, batch_size: int, seconds: float, emitted: int) -> None: ...

    def on_sequence_step(self, drafted: int, accepted: int) -> None: ...


class _NullObserver:
    def on_step(self, batch_size: int, seconds: float, emitted: int) -> None:
        return None

    def on_sequence_step(self, drafted: int, accepted: int) -> None:
        return None


@dataclass
class GlobalStats:
    steps: int = 0
    sequence_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    requests_finished: int = 0


def _truncate(tokens: list[int], stop_ids: frozenset[int], room: int) -> FinishReason | None:
    """Cut ``tokens`` after the first stop token or at ``room`` tokens, whichever comes first; say why."""
    finish: FinishReason | None = None
    for i, token in enumerate(tokens):
        if token in stop_ids:
            del tokens[i + 1 :]
            finish = FinishReason.STOP
            break
    if len(tokens) > room:
        del tokens[room:]
        return FinishReason.LENGTH
    if len(tokens) == room and finish is None:
        return FinishReason.LENGTH
    return finish


class SpeculativeScheduler:
    def __init__(
        self,
        target: TargetExecutor,
        drafter: Drafter,
        settings: SchedulerSettings,
        observer: SchedulerObserver | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.settings = settings
        self.observer: SchedulerObserver = observer or _NullObserver()
        max_k = min(settings.max_draft_len, target.max_draft_len)
        self.draft_len = DraftLenController(max_k=max_k, fixed=settings.draft_len)
        if not drafter.has_cost:
            self.draft_len.draft_token_cost = 0.0
        self.stats = GlobalStats()
        self.waiting: deque[SequenceState] = deque()
        self.running: list[SequenceState] = []
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._accepting = True
        #: times the steps (their durations feed the generation rate, the adaptive draft length and metrics)
        self._clock = clock
        self._throughput = ThroughputMeter(settings.rate_window_seconds)
        # Outputs of the last step not yet handed to their consumers (see _step); whether a flush is queued.
        self._undelivered: list[tuple[SequenceState, list[int], int, int]] = []
        self._flush_queued = False

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="speculative-scheduler")

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self, timeout: float) -> None:
        """Stop accepting, let in-flight requests finish for up to ``timeout`` seconds, abort the rest."""
        self._accepting = False
        deadline = time.monotonic() + timeout
        while (self.running or self.waiting) and time.monotonic() < deadline and self.alive:
            await asyncio.sleep(0.01)
        for seq in [*self.waiting, *self.running]:
            self._finish(seq, FinishReason.ABORT)
        self.waiting.clear()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for seq in self.running:
            self._release(seq)
        self.running.clear()

    # ----------------------------------------------------------------- requests
    def add(self, seq: SequenceState) -> None:
        if not self._accepting:
            raise EngineStoppedError("the server is shutting down")
        limit = self.settings.max_queue_size
        # a cancelled sequence leaves `running` at the next admission, before any waiting one is admitted
        live_running = sum(1 for s in self.running if s.finished is None and not s.cancelled)
        free_slots = self.settings.max_batch_size - live_running
        if limit is not None and len(self.waiting) - max(free_slots, 0) >= limit:
            raise QueueFullError(f"the request queue is full ({limit} waiting)")
        self.waiting.append(seq)
        self._wakeup.set()

    def abort(self, seq: SequenceState) -> None:
        """Cancel a request: it leaves the queue now, or the running batch before the next step."""
        if seq.finished is not None:
            return
        seq.cancelled = True
        if seq in self.waiting:
            self.waiting.remove(seq)
            seq.finished = FinishReason.ABORT
        elif seq in self.running:
            # Release now, not after the step: a backend cancels the request's executor work in flight
            # (TensorRT-LLM: cancel_request); releasing again when the sequence is dropped is harmless.
            self._release(seq)
        self._wakeup.set()

    # ----------------------------------------------------------------- load figures (autoscaling signals)
    def _live(self) -> Iterator[SequenceState]:
        """Requests still owed tokens. A running sequence that finished or was cancelled stays in ``running``
        until the next admission, but it is no longer work."""
        for seq in self.waiting:
            if seq.finished is None and not seq.cancelled:
                yield seq
        for seq in self.running:
            if seq.finished is None and not seq.cancelled:
                yield seq

    @property
    def queue_depth(self) -> int:
        """Requests waiting plus running (not finished, not cancelled)."""
        return sum(1 for _ in self._live())

    @property
    def pending_tokens(self) -> int:
        """Tokens the live requests may still generate: each up to its ``max_tokens`` and the context length
        (an upper bound: a request can stop earlier)."""
        max_model_len = self.settings.max_model_len
        return sum(
            max(min(seq.remaining_tokens, max_model_len - len(seq.token_ids)), 0) for seq in self._live()
        )

    @property
    def generation_rate(self) -> float | None:
        """Tokens emitted per second of busy time (all sequences of a step together, accepted draft tokens
        included), over about the last ``rate_window_seconds`` of busy time; None before the first step."""
        return self._throughput.rate

    @property
    def queue_seconds(self) -> float:
        """``pending_tokens / generation_rate``: seconds of generation queued here; 0 when nothing is pending
        or no rate has been measured yet."""
        pending = self.pending_tokens
        rate = self._throughput.rate
        if pending == 0 or rate is None:
            return 0.0
        return pending / rate

    # ----------------------------------------------------------------- loop
    async def _loop(self) -> None:
        while True:
            self._admit()
            if not self.running:
                self._wakeup.clear()
                if not self.waiting:
                    await self._wakeup.wait()
                continue
            started = time.perf_counter()
            try:
                await self._step(list(self.running))
            except asyncio.CancelledError:
                raise
            except RequestErrors as exc:  # only these sequences failed; the others are stepped again
                failed = [seq for seq in self.running if seq.request_id in exc.errors]
                log.warning("step failed for %d of %d requests: %s", len(failed), len(self.running), exc)
                for seq in failed or list(self.running):
                    self._fail(seq, exc.errors.get(seq.request_id, exc))
            except Exception as exc:  # a backend fault fails this batch, not the server
                log.exception("step failed; failing %d requests", len(self.running))
                for seq in list(self.running):
                    self._fail(seq, exc)
            # Consumers run while the executors work (every real step suspends). Only a step that finished
            # without suspending (instant executors) yields explicitly, so the loop cannot starve the server.
            if time.perf_counter() - started < 0.001:
                await asyncio.sleep(0)

    def _admit(self) -> None:
        for seq in [s for s in self.running if s.cancelled or s.finished is not None]:
            self._drop(seq, FinishReason.ABORT)
        while self.waiting and len(self.running) < self.settings.max_batch_size:
            seq = self.waiting.popleft()
            if not seq.cancelled:
                self.running.append(seq)

    async def _step(self, batch: list[SequenceState]) -> None:
        clock = self._clock
        t0 = clock()
        k = self.draft_len.next_k()
        # Each sequence drafts at most k, clamped so the step cannot overshoot max_tokens or the context.
        max_model_len = self.settings.max_model_len
        plan = [
            (
                seq,
                max(
                    0, min(k, seq.max_tokens - seq.num_generated - 1, max_model_len - len(seq.token_ids) - 1)
                ),
            )
            for seq in batch
        ]
        want_probs = self.settings.acceptance == AcceptanceRule.LOGITS
        drafting = any(n > 0 for _, n in plan)
        proposals: list[Proposal] = (
            await self.drafter.propose(plan, want_probs) if drafting else [Proposal([]) for _ in batch]
        )
        t1 = clock()
        if any(seq.cancelled for seq in batch):  # cancelled while drafting: not worth verifying
            kept = [(seq, prop) for seq, prop in zip(batch, proposals, strict=True) if not seq.cancelled]
            batch, proposals = [seq for seq, _ in kept], [prop for _, prop in kept]
        requests = [
            VerifyRequest(seq, prop, self.settings.acceptance)
            for seq, prop in zip(batch, proposals, strict=True)
        ]
        emitted = await self.target.verify(requests) if requests else []
        t2 = clock()
        if self.drafter.has_cost and drafting:
            self.draft_len.observe_costs(t1 - t0, max(n for _, n in plan), t2 - t1)
        elif not self.drafter.has_cost:
            self.draft_len.observe_costs(0.0, 0, t2 - t1)
        if self._undelivered:  # an earlier step's outputs always reach their consumers first
            self._flush()
        finished: list[tuple[SequenceState, StepOutput]] = []
        total = self._apply(batch, proposals, emitted, finished)
        seconds = clock() - t0
        # The step is accounted before any consumer hears of it: whoever reads the load figures after a
        # request's last output sees the step that produced it.
        self.stats.steps += 1
        if total > 0:  # emitted tokens, not steps or draft tokens: the speculative speedup is in the rate
            self._throughput.observe(total, seconds)
        self.observer.on_step(len(batch), seconds, total)
        if finished:
            # Sequences that ended get their last output now, and their consumers one turn of the event loop
            # before the next step is planned: a consumer that follows up at once (a closed-loop client, the
            # next turn of a conversation) is admitted into the freed slot at the next step, not one later.
            for seq, out in finished:
                seq.outputs.put_nowait(out)
            await asyncio.sleep(0)
        if self._undelivered and not self._flush_queued:
            # The others' outputs reach their consumers once the next step's executor call has been made: the
            # consumers' work overlaps the executors' instead of delaying the next step.
            self._flush_queued = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _apply(
        self,
        batch: Sequence[SequenceState],
        proposals: Sequence[Proposal],
        emitted: Sequence[Sequence[int]],
        finished: list[tuple[SequenceState, StepOutput]],
    ) -> int:
        """Account one step for every sequence; returns the tokens emitted.

        The output of a sequence that ended goes to ``finished``; the others' go to the undelivered (as
        tuples: their StepOutput is built when they are handed over, off the critical path). Runs for every
        sequence every step, so per-step lookups are hoisted out of the loop.
        """
        drafter_observe = self.drafter.observe
        observe_acceptance = self.draft_len.observe_acceptance
        on_sequence_step = self.observer.on_sequence_step
        max_model_len = self.settings.max_model_len
        undelivered = self._undelivered
        total = sequence_steps = total_drafted = total_accepted = 0
        for seq, prop, tokens in zip(batch, proposals, emitted, strict=True):
            if seq.cancelled or seq.finished is not None:
                continue
            drafted = len(prop.tokens)
            accepted = len(tokens) - 1 if tokens else 0
            drafter_observe(seq, prop, accepted)
            observe_acceptance(drafted, accepted)
            on_sequence_step(drafted, accepted)
            sequence_steps += 1
            total_drafted += drafted
            total_accepted += accepted
            # Tokens up to the first stop token, the max_tokens budget or the context length (at least one: a
            # sequence already at its limit still emits the one it was verified for); the common case (none of
            # them reached) takes all tokens at once.
            new = list(tokens)
            room = max(min(seq.max_tokens - seq.num_generated, max_model_len - len(seq.token_ids)), 1)
            stop_ids = seq.stop_token_ids
            finish = (
                _truncate(new, stop_ids, room)
                if len(new) >= room or (stop_ids and not stop_ids.isdisjoint(new))
                else None
            )
            n = len(new)
            seq.token_ids.extend(new)
            seq.num_generated += n
            seq_stats = seq.stats
            seq_stats.steps += 1
            seq_stats.drafted += drafted
            seq_stats.accepted += accepted
            seq_stats.emitted += n
            total += n
            if finish is None:
                undelivered.append((seq, new, drafted, accepted))
            else:
                finished.append((seq, StepOutput(new, finish, drafted, accepted)))
                self._drop(seq, finish)
        stats = self.stats
        stats.sequence_steps += sequence_steps
        stats.drafted += total_drafted
        stats.accepted += total_accepted
        stats.emitted += total
        return total

    def _flush(self) -> None:
        """Hand the undelivered outputs to their consumers."""
        self._flush_queued = False
        pending, self._undelivered = self._undelivered, []
        for seq, new, drafted, accepted in pending:
            seq.outputs.put_nowait(StepOutput(new, None, drafted, accepted))

    def _finish(self, seq: SequenceState, reason: FinishReason) -> None:
        if seq.finished is None:
            seq.finished = reason
            if reason == FinishReason.ABORT:
                self._flush()
                seq.outputs.put_nowait(StepOutput([], reason, 0, 0))

    def _drop(self, seq: SequenceState, reason: FinishReason) -> None:
        self._finish(seq, reason)
        if seq in self.running:
            self.running.remove(seq)
        self.stats.requests_finished += 1
        self._release(seq)

    def _fail(self, seq: SequenceState, exc: BaseException) -> None:
        self._flush()
        if seq.finished is None:
            seq.finished = FinishReason.ABORT
            seq.outputs.put_nowait(exc)
        if seq in self.running:
            self.running.remove(seq)
        self._release(seq)

    def _release(self, seq: SequenceState) -> None:
        self.target.release(seq.request_id)
        self.drafter.release(seq.request_id)
