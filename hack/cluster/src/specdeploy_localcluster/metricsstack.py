"""The local cluster's metrics stack: Prometheus scraping the serving pods, prometheus-adapter serving their
load gauges as pod metrics of `custom.metrics.k8s.io`: the chain a user's cluster runs for `spec.autoscaling`.

Both are configured from the chart, not from copies:

- the scrape configuration is what the Prometheus Operator makes of the chart's PodMonitor
  (`serverMetrics.podMonitor`, rendered by `helm template`): pod discovery through the Kubernetes API, the
  PodMonitor's label selector and namespace selector as `keep` relabelings, its port name and path, and the
  `namespace`/`pod` target labels the Operator adds;
- the adapter's rules are the chart's `serverMetrics.prometheusAdapterRules` ConfigMap's `config.yaml` as is.

The one local choice is the scrape interval: `SCRAPE_INTERVAL` (2 s) instead of the chart's default 10 s, set
through the chart's own value, so that tests see load within seconds. The adapter relists series every
`RELIST_INTERVAL`, so a new pod's metrics are served within about one scrape plus one relist.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from specdeploy_localcluster.paths import CHECKOUT

__all__ = [
    "EVALUATION_INTERVAL",
    "OPERATOR_JOB",
    "OPERATOR_NAMESPACE",
    "OPERATOR_TARGETS",
    "PROMETHEUS_USER",
    "RELIST_INTERVAL",
    "RULES_DIR",
    "SCRAPE_INTERVAL",
    "ChartMetrics",
    "adapter_argv",
    "load_rules",
    "prometheus_alerts",
    "prometheus_argv",
    "prometheus_config",
    "prometheus_query",
    "prometheus_rbac",
    "prometheus_targets",
    "render_chart_metrics",
    "write_config",
    "write_operator_targets",
]

SCRAPE_INTERVAL: Final = "2s"
EVALUATION_INTERVAL: Final = "5s"
"""How often the rule files are evaluated (Prometheus' default 1 m; short, so tests see alerts soon)."""
RULES_DIR: Final = "rules"
"""Under the Prometheus directory (`<cluster>/prometheus/`): the rule files Prometheus loads (`*.yaml`)."""
OPERATOR_TARGETS: Final = "operator-targets.json"
"""Under the Prometheus directory: the file_sd file naming the operator's metrics endpoint (empty: none)."""
OPERATOR_NAMESPACE: Final = "specdeploy-system"
OPERATOR_JOB: Final = "specdeploy-metrics"
"""The `job` of the operator's metrics: the Operator names a ServiceMonitor's job after the Service, and the
chart's metrics Service of release `specdeploy` is `specdeploy-metrics`."""
RELIST_INTERVAL: Final = "4s"
PROMETHEUS_USER: Final = "specdeploy-prometheus"
CHART: Final = CHECKOUT / "charts" / "specdeploy"


@dataclass(frozen=True)
class ChartMetrics:
    """What the chart renders for a metrics stack: the PodMonitor and prometheus-adapter's config.yaml."""

    podmonitor: dict[str, Any]
    adapter_config: str


def render_chart_metrics(helm: Path, chart: Path = CHART, interval: str = SCRAPE_INTERVAL) -> ChartMetrics:
    """`helm template` of the chart with its PodMonitor and adapter rules switched on."""
    import yaml  # noqa: PLC0415 - `down` and `status` run without PyYAML

    argv = [
        str(helm),
        "template",
        "specdeploy",
        str(chart),
        "--namespace=specdeploy-system",
        "--set=serverMetrics.podMonitor.enabled=true",
        f"--set=serverMetrics.podMonitor.interval={interval}",
        "--set=serverMetrics.prometheusAdapterRules.enabled=true",
        "--show-only=templates/server-podmonitor.yaml",
        "--show-only=templates/prometheus-adapter-rules.yaml",
    ]
    out = subprocess.run(argv, check=True, capture_output=True, text=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    podmonitor = next(d for d in docs if d["kind"] == "PodMonitor")
    configmap = next(d for d in docs if d["kind"] == "ConfigMap")
    return ChartMetrics(podmonitor=podmonitor, adapter_config=configmap["data"]["config.yaml"])


def _label_key(name: str) -> str:
    """The Kubernetes SD meta label of a pod label (Prometheus' sanitising: non-word characters to `_`)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)


def prometheus_config(
    podmonitor: Mapping[str, Any],
    kubeconfig: Path,
    *,
    rules_dir: Path | None = None,
    operator_targets: Path | None = None,
) -> dict[str, Any]:
    """Prometheus' configuration for `podmonitor`, as the Prometheus Operator generates it (one job per pod
    metrics endpoint; only `matchLabels`, `namespaceSelector`, `port`, `path`, `interval` and `relabelings`
    are used, which is all the chart's PodMonitor sets). Besides: the rule files in `rules_dir` (where a test
    puts the chart's alerting rules, then reloads), and the job of the operator's metrics, as the chart's
    ServiceMonitor would make it, with its targets in the file `operator_targets` (the operator runs as a
    local process on a port it picks; a test names it there with `write_operator_targets`)."""
    meta, spec = podmonitor["metadata"], podmonitor["spec"]
    sd: dict[str, Any] = {"role": "pod", "kubeconfig_file": str(kubeconfig)}
    names = (spec.get("namespaceSelector") or {}).get("matchNames")
    if names:
        sd["namespaces"] = {"names": list(names)}
    keep_labels = [
        {
            "action": "keep",
            "source_labels": [_label_key(k), _label_key(k).replace("_label_", "_labelpresent_", 1)],
            "regex": f"({re.escape(str(v))});true",
        }
        for k, v in sorted(((spec.get("selector") or {}).get("matchLabels") or {}).items())
    ]
    jobs = []
    for index, endpoint in enumerate(spec["podMetricsEndpoints"]):
        relabel = [
            *keep_labels,
            # Pods that finished are not scraped (the Operator's rule).
            {
                "action": "drop",
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "(Failed|Succeeded)",
            },
            {
                "action": "keep",
                "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                "regex": re.escape(endpoint["port"]),
            },
            {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
            {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
            {"target_label": "endpoint", "replacement": endpoint["port"]},
            # The Operator's `job` label of a PodMonitor without `jobLabel`: <namespace>/<name>.
            {"target_label": "job", "replacement": f"{meta.get('namespace', 'default')}/{meta['name']}"},
            # The endpoint's own relabelings come last, as the Operator appends them.
            *(_relabeling(r) for r in endpoint.get("relabelings", [])),
        ]
        jobs.append(
            {
                "job_name": f"podMonitor/{meta.get('namespace', 'default')}/{meta['name']}/{index}",
                "honor_labels": False,
                "scrape_interval": endpoint.get("interval", "30s"),
                "scrape_timeout": endpoint.get("scrapeTimeout", "1s"),
                "metrics_path": endpoint.get("path", "/metrics"),
                "kubernetes_sd_configs": [sd],
                "relabel_configs": relabel,
            }
        )
    if operator_targets is not None:
        jobs.append(
            {
                "job_name": OPERATOR_JOB,
                "honor_labels": True,  # the chart's ServiceMonitor honours the operator's `namespace` labels
                "scrape_interval": SCRAPE_INTERVAL,
                "scrape_timeout": "1s",
                "metrics_path": "/metrics",
                "file_sd_configs": [{"files": [str(operator_targets)]}],
            }
        )
    return {
        "global": {"evaluation_interval": EVALUATION_INTERVAL},
        "rule_files": [str(rules_dir / "*.yaml")] if rules_dir else [],
        "scrape_configs": jobs,
    }


def _relabeling(rule: Mapping[str, Any]) -> dict[str, Any]:
    """A Prometheus Operator `RelabelConfig` (camelCase) as Prometheus' `relabel_config` (snake_case)."""
    return {re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower(): value for key, value in rule.items()}


def write_operator_targets(path: Path, port: int | None, namespace: str = OPERATOR_NAMESPACE) -> None:
    """Name the operator serving metrics on 127.0.0.1:`port` (None: no operator) in the file_sd file `path`,
    labelled as the chart's ServiceMonitor labels its target (`namespace`: the release's). Prometheus
    watches the file: the target is scraped within seconds."""
    groups = [] if port is None else [{"targets": [f"127.0.0.1:{port}"], "labels": {"namespace": namespace}}]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)


def prometheus_rbac() -> list[dict[str, Any]]:
    """What Prometheus' identity may read: the pods it discovers (the upstream chart's ClusterRole, trimmed
    to pod discovery)."""
    user = {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": PROMETHEUS_USER}
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "specdeploy:prometheus"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "specdeploy:prometheus"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "specdeploy:prometheus",
            },
            "subjects": [user],
        },
    ]


def prometheus_argv(bins: Path, config_file: Path, data_dir: Path, port: int) -> list[str]:
    return [
        str(bins / "prometheus"),
        f"--config.file={config_file}",
        f"--storage.tsdb.path={data_dir}",
        "--storage.tsdb.retention.time=6h",
        f"--web.listen-address=127.0.0.1:{port}",
        # POST /-/reload: a test that put rule files in place loads them without a restart.
        "--web.enable-lifecycle",
        "--log.level=warn",
    ]


def adapter_argv(
    bins: Path,
    *,
    kubeconfig: Path,
    config_file: Path,
    prometheus_port: int,
    port: int,
    cert: Path,
    key: Path,
) -> list[str]:
    return [
        str(bins / "prometheus-adapter"),
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        f"--secure-port={port}",
        f"--tls-cert-file={cert}",
        f"--tls-private-key-file={key}",
        f"--prometheus-url=http://127.0.0.1:{prometheus_port}/",
        f"--config={config_file}",
        f"--metrics-relist-interval={RELIST_INTERVAL}",
        # Series seen in the last minute count as existing (default: the relist interval, too short for a
        # 2 s scrape that may miss one round).
        "--metrics-max-age=1m",
        "--v=1",
    ]


def _get_json(url: str, timeout: float = 5.0) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as resp:
        return json.loads(resp.read())


def prometheus_query(port: int, promql: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
    """An instant query, now or at the Unix time `at`: (labels, value) per series."""
    params = {"query": promql} if at is None else {"query": promql, "time": f"{at:.3f}"}
    url = f"http://127.0.0.1:{port}/api/v1/query?" + urllib.parse.urlencode(params)
    body = _get_json(url)
    result: Sequence[Mapping[str, Any]] = body["data"]["result"]
    return [(dict(r["metric"]), float(r["value"][1])) for r in result]


def prometheus_targets(port: int) -> list[dict[str, Any]]:
    """The active scrape targets with their health (`up`, `down`, `unknown`) and labels."""
    body = _get_json(f"http://127.0.0.1:{port}/api/v1/targets?state=active")
    targets: list[dict[str, Any]] = body["data"]["activeTargets"]
    return targets


def write_config(path: Path, config: Mapping[str, Any]) -> None:
    import yaml  # noqa: PLC0415 - `down` and `status` run without PyYAML

    path.write_text(yaml.safe_dump(dict(config), sort_keys=False))


def load_rules(port: int, rules_dir: Path, name: str, groups: Sequence[Mapping[str, Any]]) -> None:
    """Write `groups` as the rule file `<rules_dir>/<name>.yaml` and have Prometheus reload its configuration
    (`POST /-/reload`); an invalid file makes the reload fail, and this raise with Prometheus' answer."""
    import yaml  # noqa: PLC0415 - `down` and `status` run without PyYAML

    (rules_dir / f"{name}.yaml").write_text(yaml.safe_dump({"groups": list(groups)}, sort_keys=False))
    request = urllib.request.Request(f"http://127.0.0.1:{port}/-/reload", method="POST")
    with urllib.request.urlopen(request, timeout=30) as resp:
        resp.read()


def prometheus_alerts(port: int) -> list[dict[str, Any]]:
    """The alerts Prometheus holds (`pending` or `firing`), with their labels and annotations."""
    body = _get_json(f"http://127.0.0.1:{port}/api/v1/alerts")
    alerts: list[dict[str, Any]] = body["data"]["alerts"]
    return alerts
