"""The chart's dashboard and alerts against the local cluster's real Prometheus, after real traffic.

Two CPU deployments of examples/09 serve for real: `tiny-cpu` with its own draft, and `bad-draft` with a draft
that disagrees with the target (cut from a model trained one step from another seed: same tokenizer, next to
no agreement). Prometheus scrapes their pods (the chart's PodMonitor) and the session's operator (as the
chart's ServiceMonitor would, by a file_sd target), and loads the chart's PrometheusRule as a rule file. After
one abandoned request, one invalid request and traffic at two concurrencies (queries are evaluated as of the
run's end):

- `SpecDeployLowAcceptance` (window 1 m, `for` 0 s here; threshold and minimum the chart's defaults, the
  operator's own) is seen firing for `bad-draft` in `/api/v1/alerts`, while the operator's
  `SpeculationEffective` condition says `LowAcceptance` for it too;
- every query of every dashboard panel and variable returns series, except those the test names with the
  reason they are empty here (kube-state-metrics is not part of the local cluster);
- every alert's expression is evaluated: the firing one returns its deployment; each silent one is empty and
  the series it reads are shown to exist (or, named, why they do not).

With `SPECDEPLOY_DASHBOARD_RECORD=<file>` the run's Speculation row is written there as a record that
`python hack/dashboard_picture.py <file> docs/images/dashboard.png` draws.
"""

from __future__ import annotations

import functools
import json
import os
import re
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kubernetes import client
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.demomodels import MODELS_MANIFEST, make_demo_models
from specdeploy_localcluster.metricsstack import (
    OPERATOR_JOB,
    OPERATOR_NAMESPACE,
    OPERATOR_TARGETS,
    RULES_DIR,
    SCRAPE_INTERVAL,
    load_rules,
    prometheus_alerts,
    write_operator_targets,
)
from specdeploy_localcluster.operatorproc import OperatorProcess
from specdeploy_localcluster.serviceload import ServiceEndpoints, StreamingLoad

from tests.conftest import OPERATOR_NAMESPACE_PREFIX, Kubectl, cluster_running, fresh_namespace, wait_for
from tests.integration.test_real_pods import GROUP, TRAINING_STEPS, VERSION, Served
from tests.unit.dashboard_chart import dashboard, dashboard_variables, panel_queries, rule_groups

pytestmark = pytest.mark.usefixtures("operator")

BAD = "bad-draft"
UNTRAINED = "untrained-models"
# The low-acceptance alert on a short window, firing at once; thresholds stay the chart's defaults.
RULE_SETS = ["monitoring.alerts.lowAcceptance.window=1m", "monitoring.alerts.lowAcceptance.for=0s"]
# (clients per deployment, streams each deployment completes), greedy streams of 32 tokens; a phase also
# lasts SCRAPES_PER_PHASE scrapes of every pod, so each concurrency shows in the series.
PHASES = ((1, 12), (4, 24))
SCRAPES_PER_PHASE = 3
SCRAPE_SECONDS = float(SCRAPE_INTERVAL.removesuffix("s"))
SERVERS_JOB = f"{OPERATOR_NAMESPACE}/specdeploy-servers"  # the job of the chart's PodMonitor
NO_KSM = "kube-state-metrics is not part of the local cluster"
#: Names whose series are legitimately absent here, and why.
ABSENT_HERE = {
    "kube_horizontalpodautoscaler_spec_target_metric": NO_KSM,
    "kube_horizontalpodautoscaler_status_current_replicas": NO_KSM,
    "kube_horizontalpodautoscaler_spec_max_replicas": NO_KSM,
    "kube_job_failed": NO_KSM,
    "kube_job_owner": NO_KSM,
    "kube_job_status_active": NO_KSM,
    "kube_job_status_succeeded": NO_KSM,
    "kube_job_status_failed": NO_KSM,
    "specdeploy_executor_queued_requests": "TensorRT-LLM executors' statistics: the transformers backend "
    "of the CPU deployments has no executor to report",
}


@dataclass
class Run:
    cluster: LocalCluster
    namespace: str
    deployments: list[str]
    start: float
    end: float


def untrained_models(kubectl: Kubectl, namespace: str) -> None:
    """The demo's models Job again, in a claim of its own, trained one step from another seed: its draft
    shares the target's tokenizer (trained on the same text) and next to nothing else."""
    docs = list(yaml.safe_load_all(MODELS_MANIFEST.read_text()))
    claim = next(d for d in docs if d["kind"] == "PersistentVolumeClaim")
    job = next(d for d in docs if d["kind"] == "Job")
    claim["metadata"]["name"] = job["metadata"]["name"] = UNTRAINED
    pod = job["spec"]["template"]["spec"]
    next(v for v in pod["volumes"] if "persistentVolumeClaim" in v)["persistentVolumeClaim"]["claimName"] = (
        UNTRAINED
    )
    container = pod["containers"][0]
    container["command"] = [*container["command"], "--steps", "1", "--seed", "1", "--no-measure"]
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))
    kubectl("wait", "-n", namespace, "--for=condition=complete", f"job/{UNTRAINED}", "--timeout=300s")


def prometheus_dir(cluster: LocalCluster) -> Path:
    return cluster.dir / "prometheus"


def prometheus_port(cluster: LocalCluster) -> int:
    return int(cluster.state()["ports"]["prometheus"])


def abort_one_request(endpoints: ServiceEndpoints) -> None:
    """A completion whose client hangs up right after sending it (the server counts it as 499, nginx's
    "client closed request"; a stream cut short would count as the 200 it had started with)."""
    host, _, port = endpoints.base_url().removeprefix("http://").partition(":")
    body = json.dumps({"model": "target", "prompt": "Speculative decoding", "max_tokens": 256}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        conn.sendall(head + body)


def invalid_request(endpoints: ServiceEndpoints) -> None:
    got = httpx.post(
        f"{endpoints.base_url()}/v1/completions",
        json={"model": "target", "prompt": "x", "max_tokens": -1},
        timeout=60,
    )
    assert got.status_code == 400, got.text


def scraped_since(cluster: LocalCluster, namespace: str, scrapes: int, since: float) -> bool:
    """Whether Prometheus has scraped both deployments' pods `scrapes` times since the Unix time `since` (its
    last scrape of each is that many intervals later)."""
    last = cluster.prometheus_metric(f'timestamp(up{{job="{SERVERS_JOB}", namespace="{namespace}"}})')
    return len(last) == 2 and all(value >= since + scrapes * SCRAPE_SECONDS for _, value in last)


def phase_done(
    cluster: LocalCluster, namespace: str, loads: list[StreamingLoad], streams: int, began: float
) -> bool:
    """Whether each load completed `streams` streams and Prometheus scraped them all phase long."""
    completed = all(load.report.completed >= streams for load in loads)
    return completed and scraped_since(cluster, namespace, SCRAPES_PER_PHASE, began)


def counted_for_both(cluster: LocalCluster, namespace: str, status: str) -> bool:
    """Whether Prometheus has a request answered `status` from both deployments' pods."""
    series = f'specdeploy_requests_total{{namespace="{namespace}", status="{status}"}}'
    return len(cluster.prometheus_metric(series)) == 2


@pytest.fixture(scope="module")
def run(
    kubectl: Kubectl,
    api_client: client.ApiClient,
    local_cluster: LocalCluster | None,
    operator: OperatorProcess,
) -> Iterator[Run]:
    cluster = cluster_running(local_cluster, "Prometheus", "autoscaling", "SPECDEPLOY_AUTOSCALING=0")
    port, prom = prometheus_port(cluster), prometheus_dir(cluster)
    write_operator_targets(prom / OPERATOR_TARGETS, operator.metrics_port)
    load_rules(port, prom / RULES_DIR, "specdeploy", rule_groups(RULE_SETS))
    try:
        with fresh_namespace(client.CoreV1Api(api_client), OPERATOR_NAMESPACE_PREFIX) as namespace:
            make_demo_models(kubectl, namespace, TRAINING_STEPS)
            untrained_models(kubectl, namespace)
            good = Served(kubectl, api_client, namespace)
            bad = Served(kubectl, api_client, namespace)
            bad.doc["metadata"]["name"] = bad.name = BAD
            bad.doc["spec"]["draft"]["model"]["uri"] = f"pvc://{UNTRAINED}/draft"
            bad.endpoints = ServiceEndpoints(api_client, namespace, BAD)
            good.apply()
            bad.apply()
            good.wait_ready(timeout=300)
            bad.wait_ready(timeout=300)
            start = time.time()
            for s in (good, bad):  # first: their counts are scraped by the time the traffic is over
                abort_one_request(s.endpoints)
                invalid_request(s.endpoints)
            for clients, streams in PHASES:
                loads = [StreamingLoad(s.endpoints, clients=clients) for s in (good, bad)]
                began = time.time()
                for load in loads:
                    load.body["temperature"] = 0  # greedy: token match against the target's argmax
                    load.start()
                done = functools.partial(phase_done, cluster, namespace, loads, streams, began)
                wait_for(done, timeout=180, interval=0.5, what=f"{streams} streams of {clients} clients")
                for load in loads:
                    report = load.stop()
                    assert not report.failed, report.failed[:3]
            for status in ("499", "400"):  # the abandoned and the invalid request of each deployment
                counted = functools.partial(counted_for_both, cluster, namespace, status)
                wait_for(counted, timeout=120, interval=2, what=f"the requests answered {status} scraped")
            # Three more scrapes: rate() over the new series has samples to work with.
            counted_at = time.time()
            wait_for(
                lambda: scraped_since(cluster, namespace, 3, counted_at),
                timeout=60,
                interval=0.5,
                what="three scrapes of both deployments after their 499 and 400 were counted",
            )
            end = time.time()
            record = os.environ.get("SPECDEPLOY_DASHBOARD_RECORD")
            if record:
                from hack.dashboard_picture import record as speculation_record

                rec = speculation_record(
                    cluster.prometheus_url, namespace, [good.name, bad.name], start=start, end=end
                )
                Path(record).write_text(json.dumps(rec, indent=1) + "\n")
            yield Run(cluster, namespace, [good.name, bad.name], start=start, end=end)
    finally:
        (prom / RULES_DIR / "specdeploy.yaml").unlink(missing_ok=True)
        load_rules(port, prom / RULES_DIR, "empty", [])
        (prom / RULES_DIR / "empty.yaml").unlink(missing_ok=True)
        write_operator_targets(prom / OPERATOR_TARGETS, None)


def query(run: Run, promql: str) -> list[tuple[dict[str, str], float]]:
    """`promql` as of the run's end: the windows of the rules and panels (1 m) still hold its traffic, however
    long the tests before took."""
    return run.cluster.prometheus_metric(promql, at=run.end)


def fill(expr: str, run: Run) -> str:
    """A dashboard query as Grafana sends it for this namespace and both deployments."""
    expr = expr.replace("$__rate_interval", "1m").replace("$namespace", run.namespace)
    return expr.replace("$deployment", "|".join(run.deployments))


def absent_reasons(expr: str) -> set[str]:
    return {reason for name, reason in ABSENT_HERE.items() if re.search(rf"\b{name}\b", expr)}


def test_low_acceptance_fires_for_the_disagreeing_draft_as_the_operator_says(run: Run) -> None:
    def firing() -> dict[str, Any] | None:
        for alert in prometheus_alerts(prometheus_port(run.cluster)):
            labels = alert["labels"]
            if (
                labels["alertname"] == "SpecDeployLowAcceptance"
                and labels.get("deployment") == BAD
                and labels.get("namespace") == run.namespace
                and alert["state"] == "firing"
            ):
                return dict(alert)
        return None

    alert = wait_for(firing, timeout=60, interval=1, what="SpecDeployLowAcceptance firing for bad-draft")
    assert alert["annotations"]["runbook_url"].endswith("/docs/troubleshooting.md#specdeploylowacceptance")
    assert f"{run.namespace}/{BAD}" in alert["annotations"]["description"]
    assert float(alert["value"]) < 0.2


def test_the_operator_calls_the_same_deployment_ineffective(
    run: Run, kubectl: Kubectl, api_client: client.ApiClient
) -> None:
    custom = client.CustomObjectsApi(api_client)

    def low() -> bool:
        obj = custom.get_namespaced_custom_object(
            GROUP, VERSION, run.namespace, "speculativedeployments", BAD
        )
        conditions = (obj.get("status") or {}).get("conditions") or []
        return any(
            c["type"] == "SpeculationEffective" and c.get("reason") == "LowAcceptance" for c in conditions
        )

    # The operator judges the last window that drafted enough: the traffic is over, so that verdict stays.
    wait_for(low, timeout=60, interval=1, what="SpeculationEffective LowAcceptance on bad-draft")


def test_every_dashboard_query_returns_series_or_is_named_empty(run: Run) -> None:
    board = dashboard()
    empty: list[str] = []
    for q in panel_queries(board):
        got = query(run, fill(q.expr, run))
        if got:
            continue
        reasons = absent_reasons(q.expr)
        assert reasons, f"{q.row}/{q.panel}: no series for {fill(q.expr, run)}"
        empty.append(f"{q.row}/{q.panel}: {', '.join(sorted(reasons))}")
    for name, var in dashboard_variables(board).items():
        match = re.fullmatch(r"label_values\((.*),\s*(\w+)\)", var)
        assert match, var
        got = query(run, fill(match.group(1), run))
        values = {labels.get(match.group(2)) for labels, _ in got}
        wanted = {run.namespace} if name == "namespace" else set(run.deployments)
        assert wanted <= values, f"variable {name}: {values}"
    # Only what kube-state-metrics or a TensorRT-LLM executor would fill is empty here.
    assert len(empty) == len([q for q in panel_queries(board) if absent_reasons(q.expr)]), empty


def test_every_alert_expression_is_evaluated_against_the_real_prometheus(run: Run) -> None:
    by_name = {r["alert"]: r for g in rule_groups(RULE_SETS) for r in g["rules"]}
    ns, good = run.namespace, run.deployments[0]

    low = query(run, by_name["SpecDeployLowAcceptance"]["expr"])
    assert (ns, BAD) in {(labels["namespace"], labels["deployment"]) for labels, _ in low}

    # Silent for this namespace, and why: each reads series that are there.
    def ours(expr: str) -> list[dict[str, str]]:
        return [labels for labels, _ in query(run, expr) if labels.get("namespace") == ns]

    assert not ours(by_name["SpecDeployNoServingPod"]["expr"])
    serving = query(run, f'sum by (deployment) (up{{job="{SERVERS_JOB}", namespace="{ns}"}})')
    assert {labels["deployment"]: value for labels, value in serving} == {good: 1.0, BAD: 1.0}
    figures = query(run, f'specdeploy_operator_deployment_replicas{{namespace="{ns}"}}')
    assert {(labels["deployment"], labels["state"]): value for labels, value in figures} == {
        (good, "desired"): 1.0,
        (good, "ready"): 1.0,
        (BAD, "desired"): 1.0,
        (BAD, "ready"): 1.0,
    }  # the operator's figures, in the deployment's own namespace (the operator's job honours its labels)

    assert not ours(by_name["SpecDeployHighErrorRatio"]["expr"])
    statuses = {
        labels["status"] for labels, _ in query(run, f'specdeploy_requests_total{{namespace="{ns}"}}')
    }
    assert {"200", "400", "499"} <= statuses  # the traffic, the invalid request, the aborted one; no 5xx

    assert not query(run, by_name["SpecDeployOperatorDown"]["expr"])
    assert query(run, f'up{{job="{OPERATOR_JOB}", namespace="{OPERATOR_NAMESPACE}"}} == 1')

    reconciles = query(run, "sum by (kind, result) (specdeploy_operator_reconciles_total)")
    assert any(labels["result"] == "ok" for labels, _ in reconciles)
    errors = query(run, 'specdeploy_operator_reconciles_total{result="error"}')
    reconcile_alert = query(run, by_name["SpecDeployOperatorReconcileErrors"]["expr"])
    if not errors:  # no reconcile of this session ended in error: the counter's child was never made
        assert not reconcile_alert
    else:  # the alert's expression sees them, by kind
        assert {labels["kind"] for labels, _ in reconcile_alert} <= {labels["kind"] for labels, _ in errors}

    for name in ("SpecDeployQueueAboveTargetAtMaxReplicas", "SpecDeployEngineBuildFailed"):
        expr = by_name[name]["expr"]
        assert not query(run, expr)
        assert absent_reasons(expr) == {NO_KSM}, name
    assert query(run, f'specdeploy_queue_seconds{{namespace="{ns}"}}')
