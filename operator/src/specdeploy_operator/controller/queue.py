"""A work queue of object keys, in the manner of controller-runtime's: a key is queued at most once, never
processed by two workers at a time, re-queued when it is added again while being processed, and retried
with exponential backoff when processing fails. Delays are timers on the event loop: nothing sleeps.

Retries are rate-limited as controller-runtime's default controller rate limiter does: the larger of a
per-key exponential backoff (5 ms, doubling, at most 1000 s) and an overall token bucket (10 retries per
second, bursts of 100), so a failure that hits every object (an API server refusing writes, a webhook down)
cannot turn into a storm of requests."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from . import metrics

__all__ = ["WorkQueue"]

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved up; `reserve()` takes one and says how long to wait
    for it (like golang.org/x/time/rate's Reserve)."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()

    def reserve(self) -> float:
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


class WorkQueue(Generic[K]):
    """`process(key)` returns None when done, or seconds after which to look at the key again."""

    def __init__(
        self,
        process: Callable[[K], Awaitable[float | None]],
        *,
        workers: int = 4,
        base_backoff: float = 0.005,
        max_backoff: float = 1000.0,
        retry_rate: float = 10.0,
        retry_burst: int = 100,
        expected: tuple[type[Exception], ...] = (),
    ) -> None:
        """`expected`: failures already reported elsewhere (say, in the object's status), logged in one line
        without a traceback."""
        self._process = process
        self._workers = workers
        self._base_backoff = base_backoff
        self._max_backoff = max_backoff
        self._bucket = TokenBucket(retry_rate, retry_burst)
        self._expected = expected
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._dirty: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, tuple[float, asyncio.TimerHandle]] = {}
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def started(self) -> bool:
        return bool(self._tasks)

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._work(), name=f"specdeploy-worker-{i}") for i in range(self._workers)
            ]

    async def stop(self) -> None:
        for _, timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []

    def add(self, key: K) -> None:
        """Queue `key` now (a no-op if it is already waiting)."""
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
        if key in self._active:
            self._dirty.add(key)
            return
        if key in self._queued:
            return
        self._queued.add(key)
        self._queue.put_nowait(key)
        metrics.QUEUE_DEPTH.set(len(self._queued))

    def add_after(self, key: K, delay: float) -> None:
        """Queue `key` after `delay` seconds, unless it is queued sooner anyway."""
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        existing = self._timers.get(key)
        if existing is not None:
            if existing[0] <= due:
                return
            existing[1].cancel()
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def __len__(self) -> int:
        return len(self._queued)

    @property
    def idle(self) -> bool:
        """Nothing queued and nothing being processed (timers may be pending)."""
        return not self._queued and not self._active

    def failures(self, key: K) -> int:
        """How many times in a row processing `key` failed (0 after a success)."""
        return self._failures.get(key, 0)

    def retry_delay(self, failures: int) -> float:
        """When to retry after the `failures`-th failure in a row: per-key backoff, overall bucket."""
        backoff: float = min(self._max_backoff, self._base_backoff * 2.0 ** min(failures - 1, 64))
        return max(backoff, self._bucket.reserve())

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            metrics.QUEUE_DEPTH.set(len(self._queued))
            self._active.add(key)
            try:
                again = await self._process(key)
            except asyncio.CancelledError:
                raise
            except Exception as error:
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = self.retry_delay(failures)
                extra = {"key": str(key), "retry_in": delay}
                if isinstance(error, self._expected):
                    log.warning("reconcile failed; retrying", extra={**extra, "error": str(error)})
                else:
                    log.exception("reconcile failed; retrying", extra=extra)
                self._active.discard(key)
                self.add_after(key, delay)
            else:
                self._failures.pop(key, None)
                self._active.discard(key)
                if again is not None:
                    self.add_after(key, again)
            finally:
                self._active.discard(key)
                if key in self._dirty:
                    self._dirty.discard(key)
                    self.add(key)
