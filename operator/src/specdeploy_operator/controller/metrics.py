"""Prometheus metrics of the operator (served on `--metrics-port`, `/metrics`)."""

from __future__ import annotations

import contextlib
from typing import Final

from prometheus_client import Counter, Gauge, Histogram

API_REQUESTS: Final = Counter(
    "specdeploy_operator_api_requests",
    "Requests the operator's own client made to the API server, by HTTP method, resource and status code "
    "(applies, status patches, deletes, events and event lists, discovery at start-up; kopf's watches and "
    "lists are not counted).",
    ["verb", "resource", "code"],
)
RECONCILES: Final = Counter(
    "specdeploy_operator_reconciles",
    "Reconciliations by object kind and result (ok, error).",
    ["kind", "result"],
)
RECONCILE_SECONDS: Final = Histogram(
    "specdeploy_operator_reconcile_seconds",
    "Time one reconciliation took.",
    ["kind"],
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10),
)
STATUS_WRITES: Final = Counter(
    "specdeploy_operator_status_writes",
    "Status subresource writes by kind (made only when the status changes).",
    ["kind"],
)
APPLIES: Final = Counter(
    "specdeploy_operator_applies",
    "Server-side applies of children by kind (made only when the desired object changes).",
    ["kind"],
)
QUEUE_DEPTH: Final = Gauge("specdeploy_operator_queue_depth", "Keys waiting in the work queue.")
SPECULATION_SCRAPES: Final = Counter(
    "specdeploy_operator_speculation_scrapes",
    "Scrapes of serving pods' /metrics for status.speculation, by result (ok, failed).",
    ["result"],
)
DEPLOYMENT_REPLICAS: Final = Gauge(
    "specdeploy_operator_deployment_replicas",
    "Serving replicas of each SpeculativeDeployment (groups, for one that spans nodes) as of its last "
    "reconcile: desired (spec.replicas) and ready (status.readyReplicas); `namespace` is the deployment's.",
    ["namespace", "deployment", "state"],
)


def record_deployment(namespace: str, name: str, desired: int, ready: int) -> None:
    """The replica figures of a SpeculativeDeployment, for an alert on one that has none ready."""
    DEPLOYMENT_REPLICAS.labels(namespace, name, "desired").set(desired)
    DEPLOYMENT_REPLICAS.labels(namespace, name, "ready").set(ready)


def forget_deployment(namespace: str, name: str) -> None:
    """A deleted SpeculativeDeployment's figures go with it."""
    for state in ("desired", "ready"):
        with contextlib.suppress(KeyError):
            DEPLOYMENT_REPLICAS.remove(namespace, name, state)
