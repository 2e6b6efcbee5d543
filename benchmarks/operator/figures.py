"""What the record keeps of a run (JSON): the counts and times the docs render, no raw audit log."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from .accounting import AuditEntry, ProcessUsage, by_verb_resource
from .cluster import Rollout
from .run import OPERATOR_ENV, Results, poll_interval

__all__ = ["figures"]


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]
    )


def normalise_metric(metric: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
    """The metric's HTTP methods as the audit log's verbs."""
    verbs = {"PATCH": "patch", "POST": "create", "DELETE": "delete", "GET": "get", "PUT": "update"}
    out: Counter[tuple[str, str]] = Counter()
    for (verb, res), n in metric.items():
        out[(verbs.get(verb, verb.lower()), res)] += n
    return out


def request_rows(entries: list[AuditEntry], metric: Counter[tuple[str, str]]) -> list[dict[str, Any]]:
    """Requests other than watches by verb and resource, audit log next to the operator's counter, most
    frequent first."""
    audit = by_verb_resource(e for e in entries if e.verb != "watch")
    metric = normalise_metric(metric)
    keys = sorted(set(audit) | set(metric), key=lambda k: (-audit.get(k, 0), k))
    return [
        {
            "verb": verb,
            "resource": res,
            "audit": audit.get((verb, res), 0),
            "metric": metric.get((verb, res), 0),
        }
        for verb, res in keys
    ]


def watch_counts(entries: list[AuditEntry]) -> dict[str, int]:
    return dict(sorted(Counter(e.resource for e in entries if e.verb == "watch").items()))


def rollout_figures(rollout: Rollout) -> dict[str, Any]:
    return {
        "seconds": round(rollout.seconds, 2),
        "apply_seconds": round(rollout.apply_seconds, 2),
        "p50": round(pct(rollout.per_object, 50), 2),
        "p90": round(pct(rollout.per_object, 90), 2),
        "max": round(max(rollout.per_object, default=float("nan")), 2),
        "not_ready": rollout.not_ready,
    }


def process_figures(usage: dict[str, ProcessUsage]) -> dict[str, Any]:
    """The operator's memory (resident at Ready and at the end, peak) and CPU seconds by phase."""
    started, ready, end = usage["started"], usage["ready"], usage["end"]
    return {
        "rss_mib_started": round(started.rss_mib, 1),
        "rss_mib_ready": round(ready.rss_mib, 1),
        "rss_mib_end": round(end.rss_mib, 1),
        "peak_rss_mib": round(end.peak_rss_mib, 1),
        "cpu_seconds_startup": round(started.cpu_seconds, 2),
        "cpu_seconds_rollout": round(ready.cpu_seconds - started.cpu_seconds, 2),
        "cpu_seconds_steady": round(end.cpu_seconds - ready.cpu_seconds, 2),
    }


def figures(r: Results) -> dict[str, Any]:
    """What the record keeps of a run (JSON): the counts and times the docs render, no raw audit log."""
    return {
        "count": r.count,
        "replicas": r.replicas,
        "workload_kind": r.plan.workload_kind,
        "nodes_per_replica": r.plan.nodes_per_replica,
        "gpus_by_product": dict(sorted(r.plan.gpus.items())),
        "deployments_per_engine": sorted(r.plan.engines.values(), reverse=True),
        "extra_pools": [
            {"name": p.name, "nodes": p.nodes, "gpus": p.gpu.count if p.gpu else 0} for p in r.pools
        ],
        "poll_seconds": poll_interval(r.count),
        "reference": rollout_figures(r.reference),
        "operator": rollout_figures(r.operator),
        "reference_cleanup_seconds": round(r.ref_cleanup_seconds, 2),
        "requests_rollout": request_rows(r.audit_rollout, r.metric_rollout),
        "watches_rollout": watch_counts(r.audit_rollout),
        "startup_requests_by_verb": dict(
            sorted(Counter(e.verb for e in r.audit_startup if e.verb != "watch").items())
        ),
        "watches_startup": watch_counts(r.audit_startup),
        "requests_steady": request_rows(r.audit_steady, r.metric_steady),
        "watches_steady": sum(1 for e in r.audit_steady if e.verb == "watch"),
        "metric_writes_steady": sum(r.metric_steady.values()),
        "status_writes_rollout": dict(sorted(r.status_writes_rollout.items())),
        "status_writes_steady": dict(sorted(r.status_writes_steady.items())),
        "steady_seconds": round(r.steady_seconds, 1),
        "resync_seconds": int(OPERATOR_ENV["SPECDEPLOY_RESYNC_SECONDS"]),
        "engine_builds": r.engine_builds,
        "engine_phases": dict(sorted(r.engine_phases.items())),
        "jobs": r.jobs,
        "job_pods": r.job_pods,
        "log_problems": [[msg, n] for msg, n in r.log_problems.most_common(10)],
        "log_lines": r.log_lines,
        "operator_process": process_figures(r.usage),
    }
