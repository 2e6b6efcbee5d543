"""What the local cluster's autoscaling chain needs besides its processes' configuration (metricsstack.py):
the identities of prometheus-adapter, Prometheus and the Cluster Autoscaler, the API objects they need before
they start (RBAC, the adapter's Service, the kwok provider's ConfigMaps), the APIServices that route
`custom.metrics.k8s.io` to the adapter, and the Cluster Autoscaler's command line (pure)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specdeploy_localcluster.metricsstack import PROMETHEUS_USER, prometheus_rbac
from specdeploy_localcluster.nodepools import (
    CA_TEMPLATES_CONFIGMAP,
    AutoscaledPool,
    kwok_provider_config,
    node_templates,
)
from specdeploy_localcluster.pki import ClientIdentity, ServingIdentity

# Where the Cluster Autoscaler's ConfigMaps (provider config, node templates, its status) and the custom
# metrics APIService's Service live.
AUTOSCALING_NAMESPACE = "kube-system"
CA_CONFIGMAP = "kwok-provider-config"
METRICS_ADAPTER_USER = "specdeploy-metrics-adapter"
METRICS_ADAPTER_SERVICE = "specdeploy-metrics-adapter"
CUSTOM_METRICS_APISERVICES = ("v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io")
CLUSTER_AUTOSCALER_USER = "specdeploy-cluster-autoscaler"
_ADAPTER_HOST = f"{METRICS_ADAPTER_SERVICE}.{AUTOSCALING_NAMESPACE}.svc"

# The adapter's client identity has only the RBAC `autoscaling_objects` gives it, Prometheus' the RBAC
# metricsstack.prometheus_rbac gives it (it discovers pods through the API). The Cluster Autoscaler reads
# almost everything and writes nodes, pods (evictions), its status ConfigMap and events: a faithful
# ClusterRole would copy most of the upstream chart's. A test harness can accept system:masters for it; its
# own user name still tells its requests apart.
AUTOSCALING_CLIENTS = (
    ClientIdentity("metrics-adapter", METRICS_ADAPTER_USER),
    ClientIdentity("prometheus", PROMETHEUS_USER),
    ClientIdentity("cluster-autoscaler", CLUSTER_AUTOSCALER_USER, "system:masters"),
)
# The adapter serves the name the aggregator dials (<service>.<namespace>.svc).
METRICS_ADAPTER_SERVING = ServingIdentity(
    file="metrics-adapter-serving",
    common_name=_ADAPTER_HOST,
    dns_names=(_ADAPTER_HOST, f"{_ADAPTER_HOST}.cluster.local", "localhost"),
    ips=("127.0.0.1",),
)


def _binding(kind: str, name: str, role_kind: str, role: str, namespace: str | None = None) -> dict[str, Any]:
    metadata = {"name": name} if namespace is None else {"name": name, "namespace": namespace}
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": kind,
        "metadata": metadata,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": [{"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": METRICS_ADAPTER_USER}],
    }


def autoscaling_objects(pools: Iterable[AutoscaledPool], adapter_port: int) -> list[dict[str, Any]]:
    """What the adapter and the autoscaler need in the API before they start. The APIServices come apart
    (`custom_metrics_apiservices`): they go in once the adapter listens."""
    pools = list(pools)
    return [
        # prometheus-adapter lists the objects a metric is asked for (pods, namespaces), like upstream's
        # chart lets it read every resource; it writes nothing.
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "specdeploy:metrics-adapter"},
            "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}],
        },
        _binding(
            "ClusterRoleBinding", "specdeploy:metrics-adapter", "ClusterRole", "specdeploy:metrics-adapter"
        ),
        # Delegated authentication and authorization of the requests the aggregator proxies to it.
        _binding(
            "ClusterRoleBinding",
            "specdeploy:metrics-adapter:auth-delegator",
            "ClusterRole",
            "system:auth-delegator",
        ),
        _binding(
            "RoleBinding",
            "specdeploy:metrics-adapter:auth-reader",
            "Role",
            "extension-apiserver-authentication-reader",
            namespace="kube-system",
        ),
        # No kube-proxy here: the aggregator resolves an ExternalName Service to its name and dials it.
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": METRICS_ADAPTER_SERVICE, "namespace": AUTOSCALING_NAMESPACE},
            "spec": {
                "type": "ExternalName",
                "externalName": "127.0.0.1",
                "ports": [{"name": "https", "port": adapter_port, "protocol": "TCP"}],
            },
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CA_CONFIGMAP, "namespace": AUTOSCALING_NAMESPACE},
            "data": {"config": json.dumps(kwok_provider_config(pools), indent=2)},
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": CA_TEMPLATES_CONFIGMAP, "namespace": AUTOSCALING_NAMESPACE},
            "data": {
                "templates": json.dumps(
                    {"apiVersion": "v1", "kind": "List", "items": node_templates(pools)}, indent=2
                )
            },
        },
        *prometheus_rbac(),
    ]


def custom_metrics_apiservices(adapter_port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """`v1beta1` and `v1beta2.custom.metrics.k8s.io`, served by the adapter (`ca_bundle`: the cluster CA,
    base64, which signed the adapter's serving certificate)."""
    return [
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": apiservice},
            "spec": {
                "group": "custom.metrics.k8s.io",
                "version": apiservice.split(".", 1)[0],
                "groupPriorityMinimum": 100,
                "versionPriority": priority,
                "service": {
                    "namespace": AUTOSCALING_NAMESPACE,
                    "name": METRICS_ADAPTER_SERVICE,
                    "port": adapter_port,
                },
                "caBundle": ca_bundle,
            },
        }
        for apiservice, priority in zip(CUSTOM_METRICS_APISERVICES, (100, 200), strict=True)
    ]


def cluster_autoscaler_argv(bins: Path, kubeconfig: Path, port: int) -> list[str]:
    return [
        str(bins / "cluster-autoscaler"),
        "--cloud-provider=kwok",
        f"--kubeconfig={kubeconfig}",
        f"--namespace={AUTOSCALING_NAMESPACE}",
        f"--address=127.0.0.1:{port}",
        "--leader-elect=false",
        # Test timers: a pending pod gets a node within seconds, an emptied node goes after ~15 s.
        "--scan-interval=2s",
        "--max-node-provision-time=1m",
        "--scale-down-delay-after-add=10s",
        "--scale-down-delay-after-delete=2s",
        "--scale-down-delay-after-failure=10s",
        "--scale-down-unneeded-time=10s",
        "--unremovable-node-recheck-timeout=5s",
        "--node-delete-delay-after-taint=1s",
        "--max-graceful-termination-sec=5",
        "--initial-node-group-backoff-duration=10s",
        "--enforce-node-group-min-size=true",
        # The autoscaler waits until pending pods are 2 s old (30 s for GPU pods) in case more come;
        # naming a bypassed scheduler (one no pod uses) turns that wait off, nothing else.
        "--bypassed-scheduler-names=specdeploy-no-such-scheduler",
        "--expander=least-waste",
        "--skip-nodes-with-local-storage=false",
        "--v=1",
    ]


#: the Cluster Autoscaler's count of finished main loops (its loop/run.go times each as function "main")
AUTOSCALER_LOOPS = 'cluster_autoscaler_function_duration_seconds_count{function="main"}'


def autoscaler_loops(metrics_text: str) -> int:
    """The number of main loops the Cluster Autoscaler's /metrics text counts (0 before the first ends)."""
    for line in metrics_text.splitlines():
        if line.startswith(f"{AUTOSCALER_LOOPS} "):
            return int(float(line.split()[-1]))
    return 0


def cluster_autoscaler_env(kubeconfig: Path) -> dict[str, str]:
    """The kwok provider reads KUBECONFIG in local mode and its ConfigMaps from POD_NAMESPACE."""
    return {
        "KWOK_PROVIDER_MODE": "local",
        "KUBECONFIG": str(kubeconfig),
        "POD_NAMESPACE": AUTOSCALING_NAMESPACE,
    }
