"""The chart's dashboard and alerting rules as rendered by `helm template`, and every PromQL query in them:
shared by the offline tests (metric-name contract, promtool) and the live test against the local cluster's
Prometheus."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import yaml
from specdeploy_localcluster.cluster import build_binaries

REPO: Final = Path(__file__).resolve().parents[2]
CHART: Final = REPO / "charts" / "specdeploy"
RELEASE: Final = "specdeploy"
NAMESPACE: Final = "specdeploy-system"
RULE_TESTS: Final = Path(__file__).with_name("dashboard_alert_rules_test.yaml")


def bin_dir() -> Path:
    """The harness's pinned binaries, promtool included (hack/cluster/build.sh, instant on a cache hit)."""
    return build_binaries("core", "promtool")


def render(template: str, sets: Sequence[str] = ()) -> dict[str, Any]:
    """One template of the chart, rendered with `sets` (`key=value`)."""
    argv = [str(bin_dir() / "helm"), "template", RELEASE, str(CHART), f"--namespace={NAMESPACE}"]
    argv += [_set_flag(s) for s in sets] + [f"--show-only=templates/{template}"]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    doc: dict[str, Any] = yaml.safe_load(out)
    return doc


def _set_flag(assignment: str) -> str:
    """`--set-json` for a number (helm's `--set` makes `0.6` a string, which the values schema refuses),
    `--set` for anything else."""
    value = assignment.partition("=")[2]
    try:
        number = isinstance(json.loads(value), int | float)
    except ValueError:
        number = False
    return f"--set-json={assignment}" if number else f"--set={assignment}"


def rule_groups(sets: Sequence[str] = ()) -> list[dict[str, Any]]:
    """The rule groups of the chart's PrometheusRule (`monitoring.alerts.enabled=true` plus `sets`)."""
    rule = render("prometheusrule.yaml", ["monitoring.alerts.enabled=true", *sets])
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def alerts(sets: Sequence[str] = ()) -> list[dict[str, Any]]:
    return [r for g in rule_groups(sets) for r in g["rules"] if "alert" in r]


def write_rule_file(path: Path, sets: Sequence[str] = ()) -> Path:
    """The PrometheusRule's groups as a plain Prometheus rule file (what the Prometheus Operator mounts)."""
    path.write_text(yaml.safe_dump({"groups": rule_groups(sets)}, sort_keys=False))
    return path


def dashboard(sets: Sequence[str] = ()) -> dict[str, Any]:
    """The Grafana dashboard the chart's ConfigMap carries (`monitoring.dashboard.enabled=true`)."""
    configmap = render("dashboard-configmap.yaml", ["monitoring.dashboard.enabled=true", *sets])
    [body] = configmap["data"].values()
    loaded: dict[str, Any] = json.loads(body)
    return loaded


@dataclass(frozen=True)
class PanelQuery:
    """One target of one dashboard panel."""

    row: str
    panel: str
    expr: str


def panel_queries(board: dict[str, Any]) -> list[PanelQuery]:
    """Every query of every panel, with the row it sits under (rows are full-width panels of type `row`)."""
    found: list[PanelQuery] = []
    row = ""
    for panel in board["panels"]:
        if panel["type"] == "row":
            row = panel["title"]
            continue
        for target in panel.get("targets", []):
            found.append(PanelQuery(row, panel["title"], target["expr"]))
    return found


def dashboard_variables(board: dict[str, Any]) -> dict[str, str]:
    """Template variable name -> its query (`label_values(...)`)."""
    out: dict[str, str] = {}
    for var in board["templating"]["list"]:
        if var["type"] == "query":
            query = var["query"]
            out[var["name"]] = query["query"] if isinstance(query, dict) else query
    return out


def substitute_variables(expr: str, values: dict[str, str]) -> str:
    """A panel query with Grafana's variables replaced as Grafana does before it asks Prometheus
    (`$__rate_interval` by a fixed window; multi-value variables as a regex alternation)."""
    out = expr.replace("$__rate_interval", "1m")
    for name in sorted(values, key=len, reverse=True):
        out = out.replace(f"${name}", values[name])
    return out
