"""The chart's Grafana dashboard (charts/specdeploy/dashboards/specdeploy.json in the ConfigMap of
templates/dashboard-configmap.yaml): its rows and variables, and the metric-name contract: every name a panel
or an alert queries is one the server (`ServerMetrics`) or the operator (`controller/metrics.py`) really
exports, read from their metric definitions, or one of the few kube-state-metrics and Prometheus names listed
here; and the `deployment` label they group by is the one the PodMonitor makes of the label the operator puts
on its pods."""

from __future__ import annotations

import re
import subprocess

import pytest
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector
from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.builders import OperatorSettings, build_deployment
from specdeploy_operator.builders.common import INSTANCE_LABEL
from specdeploy_operator.controller import metrics as operator_metrics
from specdeploy_server.engine import ExecutorSample
from specdeploy_server.metrics import ServerMetrics

from tests.integration.test_operator import example
from tests.unit.dashboard_chart import (
    CHART,
    alerts,
    bin_dir,
    dashboard,
    dashboard_variables,
    panel_queries,
    render,
)

#: Names that come from elsewhere, and from where.
EXTERNAL_METRICS = {
    "up": "Prometheus (one per scrape target)",
    "kube_horizontalpodautoscaler_spec_target_metric": "kube-state-metrics",
    "kube_horizontalpodautoscaler_status_current_replicas": "kube-state-metrics",
    "kube_horizontalpodautoscaler_spec_max_replicas": "kube-state-metrics",
    "kube_job_failed": "kube-state-metrics",
    "kube_job_owner": "kube-state-metrics",
    "kube_job_status_active": "kube-state-metrics",
    "kube_job_status_succeeded": "kube-state-metrics",
    "kube_job_status_failed": "kube-state-metrics",
}
ROWS = ("Speculation", "Latency", "Load", "Errors", "Operator")

_SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "info": ("",),
}


def _exposed(collector: Collector) -> set[str]:
    """The sample names `collector` exposes (a counter `x` as `x_total`, a histogram as `_bucket`, …), from
    its families, which exist even before a first sample."""
    names = set()
    for family in collector.collect():
        names |= {family.name + suffix for suffix in _SUFFIXES[family.type]}
    return names


def server_metric_names() -> set[str]:
    server = ServerMetrics("m")
    server.set_config({"backend": "standin", "speculative": {"method": "draftTarget", "draftLen": 4}})
    server.bind_load(lambda: 0.0, lambda: 0.0, lambda: 0.0)
    server.bind_executor_stats(lambda: [ExecutorSample("target", 0, 0, 0.01, 1, 1)])
    return _exposed(server.registry)


def operator_metric_names() -> set[str]:
    found = set()
    for value in vars(operator_metrics).values():
        if isinstance(value, MetricWrapperBase):
            found |= _exposed(value)
    return found


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_SELECTED = re.compile(r"([a-zA-Z_:][\w:]*)\s*\{")
_OURS = re.compile(r"\b((?:specdeploy|kube)_[\w:]+)")
_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: identifiers before a `{` (not aggregation modifiers)
    and every specdeploy_/kube_ identifier outside strings (label values such as metric_name="x" are
    strings, dropped first)."""
    bare = _STRING.sub('""', expr)
    selected = {m for m in _SELECTED.findall(bare) if m not in _WORDS}
    return selected | set(_OURS.findall(bare))


def every_query() -> list[tuple[str, str]]:
    board = dashboard()
    queries = [(f"panel {q.row}/{q.panel}", q.expr) for q in panel_queries(board)]
    queries += [(f"variable {name}", query) for name, query in dashboard_variables(board).items()]
    queries += [(f"alert {a['alert']}", a["expr"]) for a in alerts()]
    return queries


def test_the_contract_reads_real_definitions() -> None:
    """The names come from the code: a counter is exposed with `_total`, a histogram with its buckets."""
    server = server_metric_names()
    assert {"specdeploy_draft_tokens_total", "specdeploy_time_to_first_token_seconds_bucket"} <= server
    assert "specdeploy_executor_queued_requests" in server
    assert "specdeploy_accepted_length_bucket" in server
    assert "specdeploy_draft_tokens" not in server
    assert {
        "specdeploy_operator_reconciles_total",
        "specdeploy_operator_queue_depth",
    } <= operator_metric_names()
    assert metric_names('sum by (le) (rate(a_b{x="specdeploy_nope"}[5m])) / on (pod) kube_x') == {
        "a_b",
        "kube_x",
    }


@pytest.mark.parametrize(("where", "expr"), every_query())
def test_every_query_uses_names_the_server_or_operator_export(where: str, expr: str) -> None:
    known = server_metric_names() | operator_metric_names() | set(EXTERNAL_METRICS)
    names = metric_names(expr)
    assert names, f"{where}: no metric in {expr!r}"
    unknown = names - known
    assert not unknown, f"{where} queries {sorted(unknown)}, which nothing exports"


def test_the_dashboard_is_off_by_default_and_carries_the_sidecar_label_and_folder() -> None:
    out = subprocess.run(
        [str(bin_dir() / "helm"), "template", "specdeploy", str(CHART)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    assert "grafana_dashboard" not in out
    configmap = render(
        "dashboard-configmap.yaml",
        [
            "monitoring.dashboard.enabled=true",
            "monitoring.dashboard.namespace=monitoring",
            "monitoring.dashboard.annotations.grafana_folder=LLM",
        ],
    )
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "LLM"}
    assert list(configmap["data"]) == ["specdeploy.json"]


def test_the_dashboard_has_its_rows_and_filters_server_panels_by_namespace_and_deployment() -> None:
    board = dashboard()
    assert set(dashboard_variables(board)) == {"namespace", "deployment"}
    queries = panel_queries(board)
    assert tuple(dict.fromkeys(q.row for q in queries)) == ROWS
    server = server_metric_names()
    for q in queries:
        if metric_names(q.expr) & server:
            assert 'namespace=~"$namespace"' in q.expr, q.panel
            assert 'deployment=~"$deployment"' in q.expr, q.panel
    titles = {q.panel for q in queries}
    for wanted in ("Acceptance rate", "Tokens per target step", "Draft length in use", "Steps speculating"):
        assert wanted in titles
    assert {q.panel for q in queries if q.row == "Latency"} == {
        "Time to first token p50 / p95 / p99",
        "Inter-token latency p50 / p95 / p99",
    }
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))


def test_the_deployment_label_is_the_podmonitors_relabeling_of_the_operators_pod_label() -> None:
    podmonitor = render("server-podmonitor.yaml", ["serverMetrics.podMonitor.enabled=true"])
    [endpoint] = podmonitor["spec"]["podMetricsEndpoints"]
    [relabel] = [r for r in endpoint["relabelings"] if r["targetLabel"] == "deployment"]
    source = "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", INSTANCE_LABEL)
    assert relabel["sourceLabels"] == [source]
    sdep = example("09")
    built = build_deployment(SpeculativeDeployment.model_validate(sdep), [], OperatorSettings())
    assert built["spec"]["template"]["metadata"]["labels"][INSTANCE_LABEL] == sdep["metadata"]["name"]
