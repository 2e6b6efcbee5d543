"""What a pass costs on ``trtllm-llmapi``, measured from TensorRT-LLM's iteration statistics.

TensorRT-LLM runs the speculative loop on this backend, so the server cannot time its steps itself; with
``enable_iter_perf_stats`` the executor records each iteration (``LLM.get_stats``: a list of dicts, or of
JSON strings in older releases) with ``iterLatencyMS``, ``numActiveRequests``, ``inflightBatchingStats``
(``numContextRequests``, ``numGenRequests``) and, while speculating, ``specDecodingStats``
(``numRequestsWithDraftTokens``, and in newer releases ``iterLatencyMS``: the drafter's time).

Only generation-only iterations are used (a prefill's cost depends on its prompt, not on the draft). Such an
iteration verifies ``numGenRequests * (w + 1)`` target tokens, where ``w`` is the padded draft width the
executor chose for ``numActiveRequests`` (:class:`WidthRule`: ``max_concurrency``, then the schedule in the
installed version's meaning): the target pass of that size took the iteration's latency less the drafter's.
Where the drafter's time is reported (a draft model), each of its ``k`` passes over ``numGenRequests``
sequences took ``1/k`` of it; where it is not, the drafting stays inside the target pass's time.

Exported as two summaries per size bucket (a factor of sqrt(2)), which the operator windows like its other
counters and hands back to the next pods as measured costs (``llmapi_measured``):
``specdeploy_target_pass_seconds{tokens}`` and ``specdeploy_draft_pass_seconds{sequences}``. Sequence steps
(``specdeploy_speculative_steps``) and those that drafted (``specdeploy_speculating_steps``) come from the
same statistics (:class:`IterationObserver`).
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from prometheus_client.core import Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from specdeploy_server.core.cost_curves import BUCKETS_PER_DOUBLING, bucket_key

log = logging.getLogger("specdeploy.llmapi")

#: seconds between two reads of the executor's statistics queue
POLL_SECONDS = 1.0


def size_bucket(size: float) -> int:
    """The representative size (a power of sqrt(2), rounded) of a positive size's bucket, the buckets of our
    own cost curves (core/cost_curves.py)."""
    return round(2 ** (bucket_key(size) / BUCKETS_PER_DOUBLING))


@dataclass(frozen=True, slots=True)
class WidthRule:
    """How TensorRT-LLM's executor decides an iteration's draft: off above ``max_concurrency`` active
    requests; else the schedule's length for the active count (``lower``: keys are lower bounds, the target
    still verifies ``max_draft_len`` positions; ``upper``: keys are upper bounds, off above the last, the
    target verifies the scheduled length); without a schedule, ``max_draft_len``."""

    max_draft_len: int
    schedule: Mapping[int, int] | None = None
    semantics: Literal["lower", "upper"] = "lower"
    max_concurrency: int | None = None

    def drafted(self, active: int) -> int:
        """Draft tokens the drafter proposes per request (its passes) with ``active`` requests."""
        if self.max_concurrency is not None and active > self.max_concurrency:
            return 0
        if not self.schedule:
            return self.max_draft_len
        keys = sorted(self.schedule)
        if self.semantics == "lower":
            at = bisect.bisect_right(keys, active) - 1
            return self.schedule[keys[at]] if at >= 0 else self.max_draft_len
        at = bisect.bisect_left(keys, active)
        return self.schedule[keys[at]] if at < len(keys) else 0

    def verified(self, active: int) -> int:
        """Draft positions the target verifies per request (the padded width)."""
        k = self.drafted(active)
        if k == 0:
            return 0
        return self.max_draft_len if self.semantics == "lower" else k


@dataclass(frozen=True, slots=True)
class Iteration:
    """What one iteration's statistics say (seconds, request counts)."""

    seconds: float
    active: int
    context: int
    generation: int
    speculating: int  # generation requests that carried draft tokens
    draft_seconds: float


def parse_iteration(stats: Mapping[str, Any] | str) -> Iteration | None:
    """One entry of ``LLM.get_stats()``; None when it is not an iteration's statistics."""
    try:
        data = json.loads(stats) if isinstance(stats, str) else stats
        batch = data["inflightBatchingStats"]
        spec = data.get("specDecodingStats") or {}
        return Iteration(
            seconds=float(data["iterLatencyMS"]) / 1000,
            active=int(data.get("numActiveRequests", 0)),
            context=int(batch.get("numContextRequests", 0)),
            generation=int(batch.get("numGenRequests", 0)),
            speculating=int(spec.get("numRequestsWithDraftTokens", 0)),
            draft_seconds=float(spec.get("iterLatencyMS", 0.0)) / 1000,
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


@runtime_checkable
class IterationObserver(Protocol):
    """Receives the sequence steps of iterations (the server's metrics implement it)."""

    def on_iterations(self, sequence_steps: int, speculating_steps: int) -> None: ...


class StepCostCollector(Collector):
    """Measured pass costs by size bucket (count, seconds), as the two summaries of the module docstring."""

    def __init__(self, model: str, rule: WidthRule) -> None:
        self.model = model
        self.rule = rule
        self.target: dict[int, list[float]] = {}  # bucket -> [iterations, seconds]
        self.draft: dict[int, list[float]] = {}  # bucket -> [passes, seconds]
        self._lock = threading.Lock()

    def observe(self, iteration: Iteration) -> None:
        if iteration.context or iteration.generation <= 0 or iteration.seconds <= 0:
            return
        width = self.rule.verified(iteration.active)
        passes = self.rule.drafted(iteration.active)
        draft_seconds = min(iteration.draft_seconds, iteration.seconds) if passes else 0.0
        with self._lock:
            target = self.target.setdefault(size_bucket(iteration.generation * (width + 1)), [0.0, 0.0])
            target[0] += 1
            target[1] += iteration.seconds - draft_seconds
            if draft_seconds > 0:
                draft = self.draft.setdefault(size_bucket(iteration.generation), [0.0, 0.0])
                draft[0] += passes
                draft[1] += draft_seconds

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            target = sorted(self.target.items())
            draft = sorted(self.draft.items())
        for name, doc, label, rows in (
            (
                "specdeploy_target_pass_seconds",
                "trtllm-llmapi: seconds of the target's pass in generation-only iterations, by the tokens it "
                "verified (size bucket), from TensorRT-LLM's iteration statistics",
                "tokens",
                target,
            ),
            (
                "specdeploy_draft_pass_seconds",
                "trtllm-llmapi: seconds of one draft-model pass, by the sequences it drafted for (size "
                "bucket), where TensorRT-LLM reports the drafter's time",
                "sequences",
                draft,
            ),
        ):
            family = SummaryMetricFamily(name, doc, labels=["model", label])
            for bucket, (count, seconds) in rows:
                family.add_metric([self.model, str(bucket)], int(count), seconds)
            yield family


class IterationStatsReader:
    """A thread that reads the executor's iteration statistics (``get_stats(timeout)``, blocking) and hands
    each iteration to the collector and to ``observer`` (the server's metrics, once attached)."""

    def __init__(self, get_stats: Callable[[float], list[Any]], collector: StepCostCollector) -> None:
        self._get_stats = get_stats
        self.collector = collector
        self.observer: IterationObserver | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.iterations = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="llmapi-iteration-stats", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5 * POLL_SECONDS)

    def read_once(self, timeout: float) -> int:
        """Read what the queue holds (waiting up to ``timeout``); returns the iterations it held."""
        entries = self._get_stats(timeout) or []
        steps = speculating = 0
        for entry in entries:
            iteration = parse_iteration(entry)
            if iteration is None:
                continue
            self.iterations += 1
            self.collector.observe(iteration)
            steps += iteration.generation
            speculating += min(iteration.speculating, iteration.generation)
        observer = self.observer
        if observer is not None and steps:
            observer.on_iterations(steps, speculating)
        return len(entries)

    def _loop(self) -> None:
        failed = False
        while not self._stop.is_set():
            try:
                if not self.read_once(POLL_SECONDS):
                    self._stop.wait(POLL_SECONDS)  # an empty queue that did not wait
                failed = False
            except Exception as error:
                if not failed:
                    log.warning(
                        "reading TensorRT-LLM's iteration statistics failed", extra={"error": str(error)}
                    )
                failed = True
                self._stop.wait(POLL_SECONDS)
