"""The local cluster's Prometheus configuration for the dashboard and alerts: the PodMonitor's relabelings
(the `deployment` label) and the Operator's `job` label, the operator's scrape job as the chart's
ServiceMonitor names it, and the rule files; valid for the pinned Prometheus (`promtool check config`)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from specdeploy_localcluster.metricsstack import (
    OPERATOR_JOB,
    prometheus_config,
    render_chart_metrics,
    write_config,
    write_operator_targets,
)

from tests.unit.dashboard_chart import bin_dir, render


def test_the_scrape_config_labels_deployments_and_jobs_as_the_prometheus_operator_does(
    tmp_path: Path,
) -> None:
    chart = render_chart_metrics(bin_dir() / "helm")
    config = prometheus_config(
        chart.podmonitor,
        tmp_path / "kubeconfig",
        rules_dir=tmp_path / "rules",
        operator_targets=tmp_path / "operator-targets.json",
    )
    servers, operator = config["scrape_configs"]
    relabel = servers["relabel_configs"]
    assert relabel[-1] == {
        "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_instance"],
        "target_label": "deployment",
    }
    assert {"target_label": "job", "replacement": "specdeploy-system/specdeploy-servers"} in relabel
    assert operator["job_name"] == OPERATOR_JOB
    service = render("service-metrics.yaml")
    assert service["metadata"]["name"] == OPERATOR_JOB  # the job a ServiceMonitor gets: its Service's name
    assert operator["file_sd_configs"] == [{"files": [str(tmp_path / "operator-targets.json")]}]
    assert config["rule_files"] == [str(tmp_path / "rules" / "*.yaml")]
    # Without them, the configuration is the PodMonitor's job alone.
    assert len(prometheus_config(chart.podmonitor, tmp_path / "kubeconfig")["scrape_configs"]) == 1


def test_promtool_accepts_the_configuration_and_the_operator_targets_file(tmp_path: Path) -> None:
    chart = render_chart_metrics(bin_dir() / "helm")
    (tmp_path / "kubeconfig").write_text("")
    (tmp_path / "rules").mkdir()
    targets = tmp_path / "operator-targets.json"
    write_operator_targets(targets, 8081)
    assert json.loads(targets.read_text()) == [
        {"targets": ["127.0.0.1:8081"], "labels": {"namespace": "specdeploy-system"}}
    ]
    write_operator_targets(targets, None)
    assert json.loads(targets.read_text()) == []
    config = prometheus_config(
        chart.podmonitor, tmp_path / "kubeconfig", rules_dir=tmp_path / "rules", operator_targets=targets
    )
    write_config(tmp_path / "prometheus.yaml", config)
    result = subprocess.run(
        [str(bin_dir() / "promtool"), "check", "config", "--syntax-only", "prometheus.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
