"""The local cluster's Prometheus and prometheus-adapter are configured from the chart, not from copies: the
scrape job is what the Prometheus Operator makes of the chart's PodMonitor, the adapter's rules file is the
chart's rules ConfigMap as rendered. (That the chain then works is tested in
tests/integration/test_autoscaling_chain.py.)"""

from __future__ import annotations

from pathlib import Path

import yaml
from specdeploy_localcluster.metricsstack import SCRAPE_INTERVAL, prometheus_config, render_chart_metrics
from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.builders import OperatorSettings, build_deployment

from tests.chart.conftest import Helm
from tests.integration.test_operator import example

CHART = Path(__file__).resolve().parents[2] / "charts" / "specdeploy"


def test_the_adapter_rules_are_the_charts_configmap_and_serve_both_queue_gauges(
    helm: Helm, helm_bin: str
) -> None:
    rendered = helm(
        "template",
        "specdeploy",
        str(CHART),
        "--namespace=specdeploy-system",
        "--set=serverMetrics.prometheusAdapterRules.enabled=true",
        "--show-only=templates/prometheus-adapter-rules.yaml",
    ).stdout
    configmap = yaml.safe_load(rendered)
    chart = render_chart_metrics(Path(helm_bin))
    assert chart.adapter_config == configmap["data"]["config.yaml"]
    rules = yaml.safe_load(chart.adapter_config)["rules"]
    assert [r["name"]["as"] for r in rules] == ["specdeploy_queue_seconds", "specdeploy_queue_depth"]


def test_the_scrape_job_selects_the_serving_pods_the_operator_builds_by_the_podmonitors_labels_and_port(
    helm_bin: str,
) -> None:
    chart = render_chart_metrics(Path(helm_bin))
    podmonitor = chart.podmonitor
    [endpoint] = podmonitor["spec"]["podMetricsEndpoints"]
    assert endpoint["interval"] == SCRAPE_INTERVAL  # the chart's value, set to the local cluster's choice
    config = prometheus_config(podmonitor, Path("/k/prometheus.kubeconfig"))
    [job] = config["scrape_configs"]
    assert job["metrics_path"] == endpoint["path"] == "/metrics"
    assert job["scrape_interval"] == SCRAPE_INTERVAL
    assert job["kubernetes_sd_configs"] == [{"role": "pod", "kubeconfig_file": "/k/prometheus.kubeconfig"}]
    relabel = job["relabel_configs"]
    # The serving pods the operator builds carry every label the PodMonitor selects, and the port it names.
    sdep_doc = example("09")
    sdep_doc["metadata"]["namespace"] = "team"
    deployment = build_deployment(SpeculativeDeployment.model_validate(sdep_doc), [], OperatorSettings())
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    for key, value in podmonitor["spec"]["selector"]["matchLabels"].items():
        assert labels[key] == value
        sanitized = "__meta_kubernetes_pod_label_" + key.replace(".", "_").replace("/", "_").replace("-", "_")
        assert {
            "action": "keep",
            "source_labels": [sanitized, sanitized.replace("_label_", "_labelpresent_", 1)],
            "regex": f"({value});true",
        } in relabel
    ports = [p["name"] for c in deployment["spec"]["template"]["spec"]["containers"] for p in c["ports"]]
    assert endpoint["port"] in ports
    port_rule = next(
        r for r in relabel if r.get("source_labels") == ["__meta_kubernetes_pod_container_port_name"]
    )
    assert port_rule == {
        "action": "keep",
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": "http",
    }
    targets = {r["target_label"] for r in relabel if "target_label" in r}
    assert {"namespace", "pod"} <= targets  # the labels the adapter's rules map to resources
