"""Prometheus metrics of one server (its own registry, so several servers can live in one process)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from specdeploy_server.config import config_digest
from specdeploy_server.core.scheduler_types import StepSpeculation
from specdeploy_server.engine import ExecutorSample

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
_ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class RequestMetrics:
    """The children of one model's per-request metrics, looked up once per server and model (a
    ``.labels()`` lookup costs a lock and a few dictionary lookups: several per request add up)."""

    ttft: Any
    itl: Any
    in_flight: Any
    prompt_tokens: Any
    generation_tokens: Any
    e2e: Any


class _ExecutorCollector(Collector):
    """Gauges read from the executors at scrape time."""

    def __init__(self, model: str, source: Callable[[], list[ExecutorSample]]) -> None:
        self.model = model
        self.source = source

    def collect(self) -> Iterator[Metric]:
        labels = ["model", "executor"]
        active = GaugeMetricFamily(
            "specdeploy_executor_active_requests", "Requests the executor is working on", labels=labels
        )
        queued = GaugeMetricFamily(
            "specdeploy_executor_queued_requests", "Requests queued inside the executor", labels=labels
        )
        latency = GaugeMetricFamily(
            "specdeploy_executor_iteration_seconds",
            "Duration of the executor's last iteration",
            labels=labels,
        )
        blocks = GaugeMetricFamily(
            "specdeploy_executor_kv_cache_blocks", "KV cache blocks", labels=[*labels, "state"]
        )
        for s in self.source():
            active.add_metric([self.model, s.executor], s.active_requests)
            queued.add_metric([self.model, s.executor], s.queued_requests)
            if s.iteration_seconds is not None:
                latency.add_metric([self.model, s.executor], s.iteration_seconds)
            if s.kv_blocks_used is not None:
                blocks.add_metric([self.model, s.executor, "used"], s.kv_blocks_used)
            if s.kv_blocks_free is not None:
                blocks.add_metric([self.model, s.executor, "free"], s.kv_blocks_free)
        yield from (active, queued, latency, blocks)


class _AcceptedLengthCollector(Collector):
    """``specdeploy_accepted_length``: a histogram of accepted draft tokens per sequence step, kept as plain
    counts per accepted length (a step adds its sequences' counts at once; buckets are built at scrape
    time)."""

    BUCKETS = tuple(range(11))  # le="0" .. le="10", then +Inf

    def __init__(self, model: str) -> None:
        self.model = model
        self.counts: list[int] = []  # counts[n]: sequence steps with n accepted draft tokens
        self.total = 0

    def add(self, accepted_counts: Sequence[int]) -> None:
        counts = self.counts
        if len(counts) < len(accepted_counts):
            counts.extend([0] * (len(accepted_counts) - len(counts)))
        for n, count in enumerate(accepted_counts):
            if count:
                counts[n] += count
                self.total += n * count

    def collect(self) -> Iterator[Metric]:
        family = HistogramMetricFamily(
            "specdeploy_accepted_length", "Draft tokens accepted per sequence step", labels=["model"]
        )
        counts = list(self.counts)
        buckets: list[tuple[str, float]] = []
        for bound in self.BUCKETS:
            buckets.append((f"{float(bound)}", float(sum(counts[: bound + 1]))))
        buckets.append(("+Inf", float(sum(counts))))
        family.add_metric([self.model], buckets, float(self.total))
        yield family


class ServerMetrics:
    """Request, token, latency and speculation metrics, plus the load gauges autoscaling reads."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.registry = CollectorRegistry()
        r, m = self.registry, ["model"]
        self.requests = Counter(
            "specdeploy_requests", "Finished HTTP requests", [*m, "endpoint", "status"], registry=r
        )
        self.errors = Counter(
            "specdeploy_request_errors", "Requests answered with an error", [*m, "type"], registry=r
        )
        self.in_flight = Gauge(
            "specdeploy_requests_in_flight", "Generation requests being served", m, registry=r
        )
        self.queue_depth = Gauge(
            "specdeploy_queue_depth", "Requests waiting or running in the engine", m, registry=r
        )
        self.queue_seconds = Gauge(
            "specdeploy_queue_seconds",
            "Tokens still to generate (waiting + running, up to max_tokens) / measured generation rate",
            m,
            registry=r,
        )
        self.generation_rate = Gauge(
            "specdeploy_generation_tokens_per_second",
            "Measured tokens/s of this replica while busy",
            m,
            registry=r,
        )
        self.prompt_tokens = Counter("specdeploy_prompt_tokens", "Prompt tokens processed", m, registry=r)
        self.generation_tokens = Counter("specdeploy_generation_tokens", "Tokens generated", m, registry=r)
        self.ttft = Histogram(
            "specdeploy_time_to_first_token_seconds",
            "Time to first token",
            m,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "specdeploy_inter_token_latency_seconds",
            "Time between output tokens (a step's gap divided by its tokens)",
            m,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "specdeploy_e2e_request_latency_seconds",
            "End-to-end latency",
            m,
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.draft_tokens = Counter("specdeploy_draft_tokens", "Draft tokens proposed", m, registry=r)
        self.accepted_tokens = Counter(
            "specdeploy_accepted_draft_tokens", "Draft tokens accepted", m, registry=r
        )
        self.spec_steps = Counter(
            "specdeploy_speculative_steps", "Sequence steps (verify calls)", m, registry=r
        )
        self.speculating_steps = Counter(
            "specdeploy_speculating_steps",
            "Sequence steps that proposed at least one draft token (a share of specdeploy_speculative_steps)",
            m,
            registry=r,
        )
        self.draft_length = Gauge(
            "specdeploy_draft_length",
            "Mean draft tokens proposed per sequence in the latest step (0: it did not speculate)",
            m,
            registry=r,
        )
        self.accepted_length = _AcceptedLengthCollector(model)
        r.register(self.accepted_length)
        self.step_seconds = Histogram(
            "specdeploy_step_seconds",
            "Duration of one draft+verify step",
            m,
            buckets=_ITL_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "specdeploy_batch_size",
            "Sequences per step",
            m,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
            registry=r,
        )

        self._request_metrics: dict[str, RequestMetrics] = {}
        # The children the step loop updates, looked up once (``.labels()`` per step costs a lock and a
        # dictionary lookup per sequence at batch 64).
        self._step_seconds = self.step_seconds.labels(model)
        self._batch_size = self.batch_size.labels(model)
        self._spec_steps = self.spec_steps.labels(model)
        self._draft_tokens = self.draft_tokens.labels(model)
        self._accepted_tokens = self.accepted_tokens.labels(model)
        self._speculating_steps = self.speculating_steps.labels(model)
        self._draft_length = self.draft_length.labels(model)

    def for_requests(self, model: str) -> RequestMetrics:
        """The per-request metrics of ``model``, bound once."""
        found = self._request_metrics.get(model)
        if found is None:
            found = self._request_metrics[model] = RequestMetrics(
                self.ttft.labels(model),
                self.itl.labels(model),
                self.in_flight.labels(model),
                self.prompt_tokens.labels(model),
                self.generation_tokens.labels(model),
                self.e2e.labels(model),
            )
        return found

    def set_config(self, config: dict[str, Any]) -> None:
        """`specdeploy_server_config_info`: which configuration this process loaded (`config_digest` of its
        effective configuration, plus the fields a rollout changes most), so a deployment can check that the
        config it rendered is the one that runs."""
        speculative = config.get("speculative") or {}
        labels = {
            "config_sha256": config_digest(config),
            "backend": str(config.get("backend")),
            "method": str(speculative.get("method")),
            "draft_len": str(speculative.get("draftLen")),
        }
        info = Gauge(
            "specdeploy_server_config_info",
            "The configuration this server loaded (value 1)",
            ["model", *labels],
            registry=self.registry,
        )
        info.labels(model=self.model, **labels).set(1)

    def bind_load(
        self, depth: Callable[[], float], seconds: Callable[[], float], rate: Callable[[], float]
    ) -> None:
        self.queue_depth.labels(self.model).set_function(depth)
        self.queue_seconds.labels(self.model).set_function(seconds)
        self.generation_rate.labels(self.model).set_function(rate)

    def bind_executor_stats(self, source: Callable[[], list[ExecutorSample]]) -> None:
        self.registry.register(_ExecutorCollector(self.model, source))

    # SchedulerObserver
    def on_step(self, batch_size: int, seconds: float, emitted: int) -> None:
        self._step_seconds.observe(seconds)
        self._batch_size.observe(batch_size)

    def on_request_speculation(self, drafted: int, accepted: int) -> None:
        """Totals of one request where the backend speculates internally (trtllm-llmapi)."""
        if drafted:
            self._draft_tokens.inc(drafted)
            self._accepted_tokens.inc(accepted)

    def on_iterations(self, sequence_steps: int, speculating_steps: int) -> None:
        """Sequence steps of iterations a backend ran itself (trtllm-llmapi's iteration statistics)."""
        self._spec_steps.inc(sequence_steps)
        self._speculating_steps.inc(speculating_steps)

    def on_speculation(self, step: StepSpeculation) -> None:
        """One step's sequences together: a few counter increments and one histogram update per step."""
        self._spec_steps.inc(step.sequence_steps)
        self._draft_length.set(step.drafted / step.sequence_steps if step.sequence_steps else 0.0)
        if step.drafted:
            # accepted_counts counts exactly the sequences that drafted, by accepted length
            self._speculating_steps.inc(sum(step.accepted_counts))
            self._draft_tokens.inc(step.drafted)
            self._accepted_tokens.inc(step.accepted)
            self.accepted_length.add(step.accepted_counts)

    def render(self) -> bytes:
        return generate_latest(self.registry)
