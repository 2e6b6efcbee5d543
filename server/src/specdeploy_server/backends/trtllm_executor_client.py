"""One TensorRT-LLM executor (``tensorrt_llm.bindings.executor.Executor``) seen from the event loop: requests
enqueued in a batch and awaited as futures, a thread that collects the executor's responses
(``await_responses``) and hands them to the loop, per-sequence cancellation of requests still in flight, and
the executor's newest iteration statistics. It knows nothing of speculation (trtllm_engine.py)."""

from __future__ import annotations

import asyncio
import datetime
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class Outcome:
    """The final state of one executor request."""

    tokens: list[int]
    finish: str | None  # FinishReason name of beam 0
    logits: Any  # generation logits ([beams, tokens, vocab]) when requested
    error: str | None
    cancelled: bool


@dataclass
class _Reply:
    request_id: int
    error: str | None
    tokens: list[int]
    final: bool
    finish: str | None
    logits: Any


@dataclass
class _Pending:
    seq_id: str
    future: asyncio.Future[Outcome]
    tokens: list[int] = field(default_factory=list)
    finish: str | None = None
    logits: Any = None
    error: str | None = None


def _convert(response: Any) -> _Reply:
    """A bindings Response -> plain data (runs on the response thread, off the event loop)."""
    request_id = int(response.request_id)
    if response.has_error():
        return _Reply(request_id, str(response.error_msg), [], True, None, None)
    result = response.result
    beams = result.output_token_ids
    reasons = result.finish_reasons
    finish = getattr(reasons[0], "name", str(reasons[0])) if reasons else None
    return _Reply(
        request_id,
        None,
        [int(t) for t in beams[0]] if beams else [],
        bool(result.is_final),
        finish,
        result.generation_logits,
    )


class ExecutorClient:
    """One executor and the thread that collects its responses and hands them to the event loop."""

    def __init__(self, name: str, executor: Any, poll_seconds: float = 0.05) -> None:
        self.name = name
        self.executor = executor
        self._poll = datetime.timedelta(seconds=poll_seconds)
        self._pending: dict[int, _Pending] = {}
        self._by_seq: dict[str, set[int]] = {}
        self._cancelled: set[int] = set()
        self._closed = False  # after shutdown() the executor refuses cancel_request
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._last_stats: Any = None

    async def run(self, requests: Sequence[tuple[str, Any]]) -> list[Outcome]:
        """Enqueue one bindings Request per sequence (``(seq_id, request)``); wait for all final results."""
        loop = asyncio.get_running_loop()
        self._start(loop)
        ids = [int(i) for i in self.executor.enqueue_requests([request for _, request in requests])]
        futures: list[asyncio.Future[Outcome]] = []
        for (seq_id, _), request_id in zip(requests, ids, strict=True):
            future: asyncio.Future[Outcome] = loop.create_future()
            self._pending[request_id] = _Pending(seq_id, future)
            self._by_seq.setdefault(seq_id, set()).add(request_id)
            futures.append(future)
        try:
            return list(await asyncio.gather(*futures))
        finally:  # also when the step itself is cancelled (shutdown): nothing stays queued in the executor
            for (seq_id, _), request_id in zip(requests, ids, strict=True):
                # Requests answered as final left _pending when their answer came: what is left is in flight.
                if self._pending.pop(request_id, None) is not None and request_id not in self._cancelled:
                    self._cancel_request(request_id)
                self._cancelled.discard(request_id)
                owned = self._by_seq.get(seq_id)
                if owned is not None:
                    owned.discard(request_id)
                    if not owned:
                        del self._by_seq[seq_id]

    def cancel(self, seq_id: str) -> None:
        """Cancel the executor requests of one sequence that are still in flight."""
        for request_id in list(self._by_seq.get(seq_id, ())):
            if request_id in self._pending and request_id not in self._cancelled:
                self._cancelled.add(request_id)
                self._cancel_request(request_id)

    def _cancel_request(self, request_id: int) -> None:
        if self._closed:  # shutdown() ended every request; the executor would throw
            return
        log.debug("%s executor: cancel_request(%d)", self.name, request_id)
        self.executor.cancel_request(request_id)

    def latest_stats(self) -> Any:
        """The newest IterationStats (the executor hands each out once; the last one is kept)."""
        stats = list(self.executor.get_latest_iteration_stats())
        if stats:
            self._last_stats = stats[-1]
        return self._last_stats

    def close(self) -> None:
        self._closed = True
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self.executor.shutdown()

    # ------------------------------------------------------------------ response thread
    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._thread is not None and self._loop is loop:
            return
        if self._thread is not None:  # a new event loop (tests run several): restart the thread for it
            self._stop.set()
            self._thread.join(timeout=10)
            self._stop = threading.Event()
        self._loop = loop
        self._thread = threading.Thread(
            target=self._collect, args=(loop, self._stop), name=f"{self.name}-responses", daemon=True
        )
        self._thread.start()

    def _collect(self, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                responses = self.executor.await_responses(timeout=self._poll)
            except Exception:  # the executor went away (shutdown) or a binding fault: keep the loop alive
                if stop.is_set():
                    return
                log.exception("%s executor: await_responses failed", self.name)
                stop.wait(self._poll.total_seconds())
                continue
            if responses:
                replies = [_convert(r) for r in responses]
                try:
                    loop.call_soon_threadsafe(self._deliver, replies)
                except RuntimeError:  # the loop is closed
                    return

    def _deliver(self, replies: list[_Reply]) -> None:
        for reply in replies:
            pending = self._pending.get(reply.request_id)
            if pending is None or pending.future.done():
                continue  # a reply for a request already given up (cancelled step)
            pending.tokens.extend(reply.tokens)
            pending.finish = reply.finish or pending.finish
            if reply.logits is not None:
                pending.logits = reply.logits
            if reply.error is not None:
                pending.error = reply.error
            if reply.final or reply.error is not None:
                del self._pending[reply.request_id]  # finished: no longer in flight, never cancelled
                pending.future.set_result(
                    Outcome(
                        pending.tokens,
                        pending.finish,
                        pending.logits,
                        pending.error,
                        reply.request_id in self._cancelled,
                    )
                )
