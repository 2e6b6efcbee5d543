"""The operator fault campaign counts the operator's requests from its own metric: the label names it filters
on must be the ones the operator exports, or a check such as "refused requests back off" reads 0 and cannot
fail."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from specdeploy_operator.controller import metrics

from benchmarks.operator_faults.campaign import api_requests


class _Exported:
    """The samples an operator exports, read the way OperatorProcess.metrics reads them."""

    def __init__(self, calls: list[tuple[str, str, str]]) -> None:
        registry = CollectorRegistry()
        counter = Counter(
            "specdeploy_operator_api_requests",
            metrics.API_REQUESTS._documentation,
            list(metrics.API_REQUESTS._labelnames),
            registry=registry,
        )
        for call in calls:
            counter.labels(*call).inc()
        self.text = generate_latest(registry).decode()

    def metrics(self) -> dict[str, float]:
        samples: dict[str, float] = {}
        for line in self.text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples


def test_refused_and_write_requests_are_counted_by_the_labels_the_operator_exports() -> None:
    op: Any = _Exported(
        [
            ("PATCH", "poddisruptionbudgets", "403"),
            ("PATCH", "poddisruptionbudgets", "403"),
            ("PATCH", "deployments", "200"),
            ("GET", "events", "200"),
        ]
    )
    assert metrics.API_REQUESTS._name == "specdeploy_operator_api_requests"
    assert api_requests(op) == 4
    assert api_requests(op, writes_only=True) == 3
    assert api_requests(op, status="403") == 2
    assert api_requests(op, writes_only=True, status="200") == 1
