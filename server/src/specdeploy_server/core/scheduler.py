"""The step loop: admits requests, drafts and verifies all running sequences once per step, emits tokens.

One asyncio task drives every running sequence in lock step (iteration-level batching): each step makes one
batched ``propose`` call on the drafter and one batched ``verify`` call on the target executor. The loop never
blocks the event loop itself; executors run their work elsewhere (a thread, a GPU, TensorRT-LLM's executor).

Request lifecycle (docs/server.md): every request has one explicit state (``SequenceState.state``), moved only
by the scheduler (here, and by its step accounting, ``step_results.py``, when a step finishes it): waiting ->
running -> finished | aborted | failed. A request that leaves the running state gets its last output at once,
but stays in ``running`` (not counted as load) until the loop is between steps; only then is its executor
state released (``_reap``), so a release never races a step that still uses it. An abort asks the executors
to stop in-flight work early (``CancelsInFlight``) and nothing more.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence

from specdeploy_server.core.adaptive import DraftLenController
from specdeploy_server.core.delivery import PendingOutputs
from specdeploy_server.core.drafters import Drafter, NoDrafter
from specdeploy_server.core.executors import (
    AcceptanceRule,
    CancelsInFlight,
    RequestErrors,
    TargetExecutor,
    VerifyRequest,
    pads_rows,
)
from specdeploy_server.core.load import ReplicaLoad
from specdeploy_server.core.logits import cut_proposal
from specdeploy_server.core.multistep import PlainMultiStep
from specdeploy_server.core.prediction_plan import PredictionPlanner
from specdeploy_server.core.scheduler_types import (
    EngineStoppedError,
    GlobalStats,
    NullObserver,
    QueueFullError,
    SchedulerObserver,
    SchedulerSettings,
    StepSpeculation,
)
from specdeploy_server.core.scheduler_types import truncate as _truncate
from specdeploy_server.core.step_results import StepAccounting
from specdeploy_server.core.types import (
    FinishReason,
    Proposal,
    RequestState,
    SequenceState,
    StepOutput,
)

__all__ = [
    "EngineStoppedError",
    "GlobalStats",
    "QueueFullError",
    "SchedulerObserver",
    "SchedulerSettings",
    "SpeculativeScheduler",
    "StepSpeculation",
    "_truncate",
]

log = logging.getLogger(__name__)

WAITING, RUNNING = RequestState.WAITING, RequestState.RUNNING
#: after a drain aborted everything, how long the step in flight gets to return before the loop is cancelled
STOP_STEP_GRACE_SECONDS = 10.0


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
        self.observer: SchedulerObserver = observer or NullObserver()
        max_k = min(settings.max_draft_len, target.max_draft_len)
        self.draft_len = DraftLenController(
            max_k=max_k,
            fixed=settings.draft_len,
            disable_above=settings.disable_above_concurrency,
            has_draft_cost=drafter.has_cost,
            padded=pads_rows(target),
        )
        self.stats = GlobalStats()
        #: the waiting queue, the running batch (ended requests stay until reaped), the generation rate
        self.load = ReplicaLoad(settings)
        self._ended: list[SequenceState] = []  # left RUNNING since the last reap: to release between steps
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._accepting = True
        self._closing = False  # stop(): the loop returns once nothing is left to reap or run
        #: times the steps (their durations feed the generation rate, the adaptive draft length and metrics)
        self._clock = clock
        #: outputs of going sequences not yet handed to their consumers (see _step)
        self._pending = PendingOutputs()
        #: drafts from the requests' own predictions, ahead of the deployment's drafter
        self._predictions = PredictionPlanner()
        self._accounting = StepAccounting(
            settings.max_model_len,
            self.stats,
            drafter,
            self.draft_len,
            self._pending,
            predictions=self._predictions.drafter,
        )
        self._phase = "idle"  # what the step in flight is doing, for error reports
        self._k = 0
        self._cancellers = [ex for ex in (target, drafter) if isinstance(ex, CancelsInFlight)]
        #: several target tokens per call for a lone plain sequence (core/multistep.py); None with a drafter
        self._multistep = PlainMultiStep() if isinstance(drafter, NoDrafter) else None

    # ----------------------------------------------------------------- lifecycle
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="speculative-scheduler")

    @property
    def alive(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self, timeout: float) -> None:
        """Stop accepting, let in-flight requests finish for up to ``timeout`` seconds, abort the rest.

        Aborted requests are released by the loop once the step in flight has returned (it is not cancelled
        under the executors); only a step still running ``STOP_STEP_GRACE_SECONDS`` later is cancelled.
        """
        self._accepting = False
        deadline = time.monotonic() + timeout
        while self.queue_depth and time.monotonic() < deadline and self.alive:
            await asyncio.sleep(0.01)
        left = [*self.waiting, *self.running]
        if left:
            why = f"the {timeout:.1f} s shutdown timeout" if self.alive else "the end of the scheduler loop"
            log.warning("drain: %d request(s) unfinished at %s: aborted", len(left), why)
        for seq in left:
            self.abort(seq)
        self._closing = True
        self._wakeup.set()
        task, self._task = self._task, None
        if task is not None:
            done, _ = await asyncio.wait({task}, timeout=STOP_STEP_GRACE_SECONDS)
            if not done:
                log.error("the step in flight did not return %.0f s after the drain", STOP_STEP_GRACE_SECONDS)
                task.cancel()
                await asyncio.wait({task})
            elif not task.cancelled() and task.exception() is not None:
                log.error("the scheduler loop had ended with an error", exc_info=task.exception())
        self._reap()

    # ----------------------------------------------------------------- load (core/load.py)
    @property
    def waiting(self) -> deque[SequenceState]:
        """Requests waiting for a batch slot, in arrival order."""
        return self.load.waiting

    @property
    def running(self) -> list[SequenceState]:
        """The running batch, with the requests that ended since the last reap."""
        return self.load.running

    @property
    def queue_depth(self) -> int:
        return self.load.queue_depth

    def queue_full(self) -> bool:
        return self.load.queue_full()

    @property
    def pending_tokens(self) -> int:
        return self.load.pending_tokens

    @property
    def generation_rate(self) -> float | None:
        return self.load.generation_rate

    @property
    def queue_seconds(self) -> float:
        return self.load.queue_seconds

    # ----------------------------------------------------------------- requests
    def add(self, seq: SequenceState) -> None:
        if not self._accepting:
            raise EngineStoppedError("the server is shutting down")
        if self.queue_full():
            raise QueueFullError(f"the request queue is full ({self.settings.max_queue_size} waiting)")
        seq.state = WAITING
        self.waiting.append(seq)
        self._wakeup.set()

    def abort(self, seq: SequenceState) -> None:
        """Cancel a request (its consumer went away, or the server drains): its consumer gets a final
        ``abort`` output now; it leaves the queue now, or the running batch between steps (releasing its
        executor state then). Work in flight for it is cancelled where the executors can."""
        if seq.state is WAITING:
            self.waiting.remove(seq)
            self._end(seq, RequestState.ABORTED)
        elif seq.state is RUNNING:
            self._end(seq, RequestState.ABORTED)
            for executor in self._cancellers:
                try:
                    executor.cancel(seq.request_id)
                except Exception:  # a failed cancel only costs the rest of that work
                    log.exception("cancelling request %s in flight failed", seq.request_id)
            self._wakeup.set()

    # ----------------------------------------------------------------- loop
    async def _loop(self) -> None:
        while True:
            self._reap()  # between steps: the only place executor state is released
            self._admit()
            if not self.running:
                if self._closing:
                    return
                self._wakeup.clear()
                if not self.waiting:
                    await self._wakeup.wait()
                continue
            batch = list(self.running)
            started = time.perf_counter()
            try:
                await self._step(batch)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a backend fault fails what it can be attributed to, never the server
                self._step_failed(batch, exc)
            finally:
                self._phase = "idle"
            # Consumers run while the executors work (every real step suspends). Only a step that finished
            # without suspending (instant executors) yields explicitly, so the loop cannot starve the server.
            if time.perf_counter() - started < 0.001:
                await asyncio.sleep(0)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.settings.max_batch_size:
            seq = self.waiting.popleft()
            seq.state = RUNNING
            self.running.append(seq)

    def _reap(self) -> None:
        """Drop the sequences that ended from ``running`` and release their executor state."""
        if not self._ended:
            return
        ended, self._ended = self._ended, []
        self.load.drop(ended)
        for seq in ended:
            self.draft_len.forget(seq.request_id)
            self._predictions.drafter.release(seq.request_id)
            for executor in (self.target, self.drafter):
                try:
                    executor.release(seq.request_id)
                except Exception:  # a leak in one backend must not stop the loop
                    log.exception("releasing request %s failed", seq.request_id)

    def _step_failed(self, batch: Sequence[SequenceState], exc: Exception) -> None:
        """Fail the requests a step's exception is attributed to, or, when it cannot be attributed, the
        requests of that step that are still running (not the waiting ones, not the server)."""
        live = [seq for seq in batch if seq.state is RUNNING]
        context = (
            f"step {self.stats.steps + 1} ({self._phase}, k={self._k}, {len(batch)} requests: "
            f"{', '.join(seq.request_id[:8] for seq in batch[:8])}{', ...' if len(batch) > 8 else ''})"
        )
        if isinstance(exc, RequestErrors) and any(seq.request_id in exc.errors for seq in batch):
            failed = [seq for seq in live if seq.request_id in exc.errors]
            log.warning("%s: the backend failed %d request(s): %s", context, len(failed), exc)
            for seq in failed:
                self._fail(seq, exc.errors[seq.request_id])
            return  # the others committed nothing of this step: they are stepped again
        log.error(
            "%s failed and cannot be attributed to a request: failing its %d running request(s)",
            context,
            len(live),
            exc_info=exc,
        )
        for seq in live:
            self._fail(seq, exc)

    async def _step(self, batch: list[SequenceState]) -> None:
        clock = self._clock
        t0 = clock()
        prefills = any(not seq.num_generated for seq in batch)  # a prompt's own forwards ride in this step
        lengths = self.draft_len.plan([seq.request_id for seq in batch])
        self._k = max(lengths, default=0)
        max_model_len = self.settings.max_model_len
        forced = self._accounting.fast_forward(batch)
        # Each sequence drafts at most its k (and its own cap), clamped so the step cannot overshoot
        # max_tokens or the context; a sequence whose prediction proposes drafts from it instead.
        plan, predicted = self._predictions.plan(batch, lengths, max_model_len, self.target.max_draft_len)
        want_probs = self.settings.acceptance == AcceptanceRule.LOGITS
        drafting = any(n > 0 for _, n in plan)
        self._phase = "draft"
        # The draft call is timed alone: the plan search above is the controller's own time, not a cost of
        # drafting (counted in it, it would make drafting look dearer the more often the controller searches).
        t_draft = clock()
        proposals: list[Proposal] = (
            await self.drafter.propose(plan, want_probs) if drafting else [Proposal([]) for _ in batch]
        )
        t1 = clock()
        proposals = [predicted.get(i, prop) for i, prop in enumerate(proposals)] if predicted else proposals
        if any(seq.state is not RUNNING for seq in batch):  # aborted while drafting: not worth verifying
            kept = [(seq, prop) for seq, prop in zip(batch, proposals, strict=True) if seq.state is RUNNING]
            batch, proposals = [seq for seq, _ in kept], [prop for _, prop in kept]
        requests = self._verify_requests(batch, proposals)
        extra = max((r.extra for r in requests), default=0)
        self._phase = "verify"
        emitted = await self.target.verify(requests) if requests else []
        self._phase = "account"
        t2 = clock()
        if requests:
            if not extra:  # a multi-step call is several forwards in a row: not a verify call's cost
                verify_tokens = sum(len(r.proposal.tokens) + 1 for r in requests)
                self.draft_len.observe_costs(
                    [n for _, n in plan], t1 - t_draft, verify_tokens, t2 - t1, prefills=prefills
                )
            self._observe_multistep(requests, emitted, t2 - t1)
        pending = self._pending
        if pending.items:  # an earlier step's outputs always reach their consumers first
            pending.flush()
        finished: list[tuple[SequenceState, StepOutput]] = []
        applied, speculation = self._accounting.apply(
            batch, proposals, requests, emitted, finished=finished, ended=self._ended
        )
        total = forced + applied
        if speculation is not None:
            self.observer.on_speculation(speculation)
        seconds = clock() - t0
        # The step is accounted before any consumer hears of it: whoever reads the load figures after a
        # request's last output sees the step that produced it.
        self.stats.steps += 1
        if total > 0:  # emitted tokens, not steps or draft tokens: the speculative speedup is in the rate
            self.load.throughput.observe(total, seconds)
        self.observer.on_step(len(batch), seconds, total)
        if finished:
            # Sequences that ended get their last output now, and their consumers one turn of the event loop
            # before the next step is planned: a consumer that follows up at once (a closed-loop client, the
            # next turn of a conversation) is admitted into the freed slot at the next step, not one later.
            for seq, out in finished:
                seq.outputs.put_nowait(out)
            await asyncio.sleep(0)
        # The others' outputs reach their consumers once the next step's executor call has been made: the
        # consumers' work overlaps the executors' instead of delaying the next step.
        pending.flush_soon()

    def _verify_requests(self, batch: list[SequenceState], proposals: list[Proposal]) -> list[VerifyRequest]:
        """The step's verify requests: each proposal without what its grammar forbids; a lone plain sequence
        with nothing proposed may decode several tokens (core/multistep.py)."""
        multistep = self._multistep
        waiting, max_model_len = len(self.waiting), self.settings.max_model_len
        extra = multistep.extra(batch, waiting, max_model_len) if multistep is not None else 0
        return [
            VerifyRequest(
                seq,
                cut_proposal(seq, prop),
                self.settings.acceptance,
                [] if seq.params.logprobs is not None else None,
                extra if not prop.tokens else 0,
            )
            for seq, prop in zip(batch, proposals, strict=True)
        ]

    def _observe_multistep(
        self, requests: list[VerifyRequest], emitted: list[list[int]], seconds: float
    ) -> None:
        """A lone plain sequence's call: its seconds per token (not a drafted one's, nor a prefill's)."""
        multistep = self._multistep
        if multistep is None or len(requests) != 1:
            return
        lone = requests[0]
        if lone.seq.num_generated and not lone.proposal.tokens:
            multistep.observe(len(emitted[0]), seconds)

    def _end(self, seq: SequenceState, state: RequestState, error: BaseException | None = None) -> None:
        """Move a live request to ``state`` (aborted or failed) and give its consumer the last output; a
        running one is released at the next reap."""
        was_running = seq.state is RUNNING
        seq.state = state
        seq.finished = FinishReason.ABORT
        self._pending.flush()  # whatever the consumer is owed comes first
        seq.outputs.put_nowait(error if error is not None else StepOutput([], FinishReason.ABORT, 0, 0))
        if was_running:
            self._ended.append(seq)
            if state is RequestState.ABORTED:
                self.stats.requests_finished += 1

    def _fail(self, seq: SequenceState, exc: BaseException) -> None:
        if seq.state.live:
            self.stats.requests_failed += 1
            self._end(seq, RequestState.FAILED, exc)
