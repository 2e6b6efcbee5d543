"""What the step loop is configured with and reports: settings, errors, statistics, the observer protocol.

Re-exported by :mod:`specdeploy_server.core.scheduler`, where the rest of the server imports them from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Protocol

from specdeploy_server.core.executors import AcceptanceRule
from specdeploy_server.core.types import FinishReason


class QueueFullError(Exception):
    """The waiting queue is at ``maxQueueSize`` (a positive bound; 0 or None set no bound)."""


class EngineStoppedError(Exception):
    """The scheduler is shutting down and takes no new requests."""


@dataclass(frozen=True)
class SchedulerSettings:
    max_batch_size: int = 64
    #: waiting (not yet running) requests beyond the batch before QueueFullError; 0 or None: no limit
    #: (TensorRT-LLM's executor and llgtrt read max_queue_size 0 or unset the same way)
    max_queue_size: int | None = None
    max_model_len: int = 4096
    acceptance: str = AcceptanceRule.TOKEN_MATCH
    draft_len: int | None = 4  # None = adaptive
    max_draft_len: int = 10
    #: above this many sequences in a step nobody drafts (``disableAboveConcurrency``); None: no such rule
    disable_above_concurrency: int | None = None
    #: busy seconds the measured generation rate averages over (see ThroughputMeter)
    rate_window_seconds: float = 10.0


@dataclass(frozen=True)
class StepSpeculation:
    """The speculation statistics of one step, all its sequences together (one observer call per step,
    not one per sequence)."""

    sequence_steps: int
    drafted: int
    accepted: int
    #: accepted_counts[n]: sequences of the step that drafted and had n draft tokens accepted
    accepted_counts: Sequence[int]


class SchedulerObserver(Protocol):
    """Receives statistics as they happen, once per step (the metrics module implements it)."""

    def on_step(self, batch_size: int, seconds: float, emitted: int) -> None: ...

    def on_speculation(self, step: StepSpeculation) -> None: ...


class NullObserver:
    def on_step(self, batch_size: int, seconds: float, emitted: int) -> None:
        return None

    def on_speculation(self, step: StepSpeculation) -> None:
        return None


@dataclass
class GlobalStats:
    steps: int = 0
    sequence_steps: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    #: tokens a grammar forced, emitted without a model step (part of ``emitted``)
    forced: int = 0
    requests_finished: int = 0
    #: requests the backend failed (attributed to them, or in a step that failed as a whole)
    requests_failed: int = 0

    def since(self, before: GlobalStats) -> GlobalStats:
        """What was counted after ``before`` (an earlier copy of these figures) was taken."""
        return GlobalStats(**{f.name: getattr(self, f.name) - getattr(before, f.name) for f in fields(self)})


def truncate(tokens: list[int], stop_ids: frozenset[int], room: int) -> FinishReason | None:
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
