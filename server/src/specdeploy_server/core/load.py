"""The load of one replica: the requests its scheduler holds, the rate it generates at, and the figures made
from them (the inputs of its autoscaling signals; no HTTP, no backend)."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING

from specdeploy_server.core.types import RequestState, SequenceState

if TYPE_CHECKING:
    from specdeploy_server.core.scheduler_types import SchedulerSettings


class ThroughputMeter:
    """Tokens emitted per second of busy time, over about the last ``window_seconds`` of busy time.

    Tokens and busy seconds are kept as two exponentially decayed sums and the rate is their ratio, so a
    step weighs in proportion to its duration (a ratio of sums, not a mean of per-step ratios). The decay
    runs on busy time only: an idle replica keeps the rate it last measured instead of drifting to zero.
    What counts as a token is the caller's choice; the scheduler feeds it the tokens each step *emitted*
    (accepted draft tokens + one of the target's own per sequence), so a better-accepted draft shows as a
    higher rate.
    """

    def __init__(self, window_seconds: float = 10.0) -> None:
        if not window_seconds > 0:
            raise ValueError("window_seconds must be positive")
        self.window_seconds = window_seconds
        self._tokens = 0.0
        self._seconds = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        """Account ``tokens`` produced in ``seconds`` of busy time (ignored unless ``seconds`` > 0)."""
        if not seconds > 0:
            return
        decay = math.exp(-seconds / self.window_seconds)
        self._tokens = self._tokens * decay + tokens
        self._seconds = self._seconds * decay + seconds

    @property
    def rate(self) -> float | None:
        """Tokens per busy second; None until some tokens were observed."""
        if self._tokens <= 0 or self._seconds <= 0:
            return None
        return self._tokens / self._seconds


class ReplicaLoad:
    """The requests one scheduler holds and the rate it generates at, and the load figures made from them
    (autoscaling signals, the admission gate's question).

    Owns the waiting queue, the running batch and the generation rate meter. The scheduler moves requests
    between the queues (and moves their states); a request that ended stays in ``running`` until the
    scheduler's loop is between steps (``drop``), but it no longer counts as load.
    """

    def __init__(self, settings: SchedulerSettings) -> None:
        self.waiting: deque[SequenceState] = deque()  # all WAITING
        self.running: list[SequenceState] = []  # RUNNING, or ended and not yet dropped
        self._settings = settings
        #: fed the tokens each step emitted and the step's duration by the scheduler
        self.throughput = ThroughputMeter(settings.rate_window_seconds)

    def drop(self, ended: Collection[SequenceState]) -> None:
        """Remove ``ended`` (requests that left the running state) from the running batch."""
        gone = set(map(id, ended))
        self.running = [seq for seq in self.running if id(seq) not in gone]

    def _live(self) -> Iterator[SequenceState]:
        """Requests still owed tokens: waiting and running ones."""
        yield from self.waiting
        for seq in self.running:
            if seq.state is RequestState.RUNNING:
                yield seq

    @property
    def queue_depth(self) -> int:
        """Requests waiting plus running."""
        return len(self.waiting) + sum(1 for seq in self.running if seq.state is RequestState.RUNNING)

    def queue_full(self) -> bool:
        """Whether the next request would be refused (``QueueFullError``): ``maxQueueSize`` requests already
        wait beyond the batch slots free now. Cheap (a look at the running batch): the admission gate asks it
        for every generation request."""
        limit = self._settings.max_queue_size
        if not limit:
            return False
        # an ended sequence leaves `running` at the next reap, before any waiting one is admitted
        live_running = sum(1 for seq in self.running if seq.state is RequestState.RUNNING)
        free_slots = max(self._settings.max_batch_size - live_running, 0)
        return len(self.waiting) - free_slots >= limit

    @property
    def pending_tokens(self) -> int:
        """Tokens the live requests may still generate: each up to its ``max_tokens`` and the context length
        (an upper bound: a request can stop earlier)."""
        max_model_len = self._settings.max_model_len
        return sum(
            max(min(seq.remaining_tokens, max_model_len - len(seq.token_ids)), 0) for seq in self._live()
        )

    @property
    def generation_rate(self) -> float | None:
        """Tokens emitted per second of busy time (all sequences of a step together, accepted draft tokens
        included), over about the last ``rate_window_seconds`` of busy time; None before the first step."""
        return self.throughput.rate

    @property
    def queue_seconds(self) -> float:
        """``pending_tokens / generation_rate``: seconds of generation queued here; 0 when nothing is pending
        or no rate has been measured yet."""
        pending = self.pending_tokens
        rate = self.throughput.rate
        if pending == 0 or rate is None:
            return 0.0
        return pending / rate
