"""Where backend ``trtllm-llmapi`` gets each request's draft/accepted counts, and the metric that says so.

Where our own drafter runs in the server's process (promptLookup with ``TLLM_WORKER_USE_SINGLE_PROCESS=1``),
drafted is what it proposed for the request (before TensorRT-LLM pads it) and accepted what the stream shows.
Otherwise every request sets ``return_perf_metrics``, and its final output's
``request_perf_metrics.speculative_decoding`` (drafted, accepted) is used where it is real; TensorRT-LLM 1.2.x
returns it zeroed in the PyTorch flow with the default sampler (fixed upstream after 1.2.1). Otherwise the
counts come from the stream itself: each streamed output is one executor response, i.e. one iteration, and
the tokens it adds beyond 1 are accepted draft tokens; drafted is ``k`` per generation iteration (exact for
methods that always draft ``k``, an upper bound for promptLookup in a worker process, which drafts only on an
n-gram match).
``specdeploy_llmapi_acceptance_source_total{source}`` in /metrics counts requests by where their figures
came from.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

#: where a request's draft/accepted counts came from
SOURCE_PERF_METRICS = "perf_metrics"  # TensorRT-LLM's request_perf_metrics.speculative_decoding
SOURCE_TOKEN_COUNTS = "token_counts"  # tokens per streamed response beyond 1; k drafted per generation step
SOURCE_DRAFTER = "drafter"  # drafted counted by our drafter in this process; accepted from the stream


@runtime_checkable
class RequestObserver(Protocol):
    """Receives per-request speculation totals (the LLM API reports them per request, not per step)."""

    def on_request_speculation(self, drafted: int, accepted: int) -> None: ...


class AcceptanceSources(Collector):
    """``specdeploy_llmapi_acceptance_source_total{source}``: finished requests by where their acceptance
    figures came from, so a dashboard knows what ``specdeploy_accepted_draft_tokens_total`` is made of."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.counts = {SOURCE_DRAFTER: 0, SOURCE_PERF_METRICS: 0, SOURCE_TOKEN_COUNTS: 0}

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "specdeploy_llmapi_acceptance_source",
            "trtllm-llmapi requests whose draft/accepted counts came from our drafter in the server's "
            "process and the stream (drafter), TensorRT-LLM's request perf metrics (perf_metrics) or the "
            "stream alone: tokens per response beyond 1 accepted, draft length per generation step drafted "
            "(token_counts)",
            labels=["model", "source"],
        )
        for source, count in self.counts.items():
            family.add_metric([self.model, source], count)
        yield family


class StreamCounts:
    """What one request's stream shows: each output is one executor response (one iteration); the first is
    the context step, each later one a generation step whose tokens beyond 1 are accepted draft tokens."""

    def __init__(self) -> None:
        self.responses = 0
        self.steps = 0  # generation steps (responses with tokens after the first)
        self.accepted = 0

    def observe(self, new_tokens: int) -> None:
        self.responses += 1
        if self.responses > 1 and new_tokens > 0:
            self.steps += 1
            self.accepted += new_tokens - 1


def request_acceptance(
    completion: Any, counts: StreamCounts, draft_len: int, proposed: int | None = None
) -> tuple[str, int, int]:
    """``(source, drafted, accepted)`` of a finished request: what our drafter ``proposed`` for it where it
    counted, with what the stream shows accepted (at most that); else TensorRT-LLM's ``request_perf_metrics``
    where they are real; else what the stream showed (``counts``, ``draft_len`` drafted per generation
    step)."""
    if proposed is not None:
        return SOURCE_DRAFTER, proposed, min(counts.accepted, proposed)
    metrics = getattr(completion, "request_perf_metrics", None)
    spec = getattr(metrics, "speculative_decoding", None)
    reported = (0, 0)
    if spec is not None:
        reported = (int(spec.total_draft_tokens), int(spec.total_accepted_draft_tokens))
    # Zeroed counters (1.2.x, PyTorch flow, default sampler) are not real: the stream shows acceptance.
    if reported[0] > 0 and (reported[1] > 0 or counts.accepted == 0):
        return SOURCE_PERF_METRICS, reported[0], reported[1]
    drafted = counts.steps * draft_len
    return SOURCE_TOKEN_COUNTS, drafted, min(counts.accepted, drafted)
