"""Starting a local cluster's processes in order, each waited for, and stopping them in reverse: the control
plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok), the node agents (the provisioner
and the pod runner, both ours), the LeaderWorkerSet controller and the autoscaling chain (Prometheus,
prometheus-adapter, the Cluster Autoscaler). LocalCluster (cluster.py) prepares the cluster's directory first
(PKI, ports, kubeconfigs) and applies the node pools once the control plane serves."""

from __future__ import annotations

import base64
import contextlib
import functools
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

from specdeploy_localcluster.adminapi import AdminApi
from specdeploy_localcluster.autoscalingstack import (
    AUTOSCALING_NAMESPACE,
    CUSTOM_METRICS_APISERVICES,
    autoscaling_objects,
    cluster_autoscaler_argv,
    cluster_autoscaler_env,
    custom_metrics_apiservices,
)
from specdeploy_localcluster.components import ComponentProcesses
from specdeploy_localcluster.controlplane import (
    AUDIT_POLICY,
    NODE_IP,
    apiserver_argv,
    controller_manager_argv,
    etcd_argv,
    kwok_argv,
    kwok_stages,
    scheduler_argv,
)
from specdeploy_localcluster.lwscontroller import (
    LWS_WEBHOOK_SERVING,
    lws_argv,
    lws_config,
    lws_objects,
    probe_leader_pod,
    probe_leaderworkerset,
    webhook_configurations,
    webhooks_answered,
)
from specdeploy_localcluster.metricsstack import (
    OPERATOR_TARGETS,
    RULES_DIR,
    adapter_argv,
    prometheus_argv,
    prometheus_config,
    render_chart_metrics,
    write_config,
    write_operator_targets,
)
from specdeploy_localcluster.nodepools import AutoscaledPool
from specdeploy_localcluster.podrunner.selection import DEFAULT_IMAGES
from specdeploy_localcluster.processes import free_port, port_open

# Start order; stopped in reverse. The provisioner and the pod runner are ours (provisioner.py, podrunner/).
COMPONENTS = (
    "etcd",
    "kube-apiserver",
    "kube-controller-manager",
    "kube-scheduler",
    "kwok",
    "provisioner",
    "pod-runner",
)
# Started after the control plane unless autoscaling is switched off (`SPECDEPLOY_AUTOSCALING=0`).
AUTOSCALING_COMPONENTS = ("prometheus", "metrics-adapter", "cluster-autoscaler")
# Started after the node agents unless switched off (`SPECDEPLOY_LWS=0`).
LWS_COMPONENTS = ("lws-controller",)
# The autoscaler first, while the API is up (on exit it deletes the nodes it made), then everything that talks
# to etcd, then etcd: an apiserver that loses etcd mid-shutdown hangs.
STOP_WAVES = (
    AUTOSCALING_COMPONENTS + LWS_COMPONENTS,
    tuple(n for n in COMPONENTS if n != "etcd"),
    ("etcd",),
)
# What the start writes into the cluster's directory besides logs, pids, PKI and kubeconfigs.
_STARTUP_STATE = ("etcd-data", "apiserver-certs", "prometheus", "kwok-stages.yaml", "lws")
# The name of the dry-run LeaderWorkerSet and leader pod that prove the LWS webhooks answer (never stored).
_LWS_PROBE = "specdeploy-webhook-probe"


def choose_ports(autoscaling: bool, lws: bool = False) -> dict[str, int]:
    """A free loopback port for each listener of the cluster (taken ones are found at start: `PortTaken`)."""
    names = ["etcd", "etcd_peer", "apiserver", "kwok"]
    if autoscaling:
        names += ["prometheus", "metrics_adapter", "cluster_autoscaler"]
    if lws:
        names += ["lws_webhook"]
    return {name: free_port() for name in names}


class Startup:
    """One start of the cluster in `directory` with the binaries in `bins`, everything done by `deadline`
    (time.monotonic())."""

    def __init__(
        self,
        processes: ComponentProcesses,
        *,
        bins: Path,
        directory: Path,
        pki: Path,
        kubeconfigs: Path,
        deadline: float,
    ) -> None:
        self.processes = processes
        self.bins = bins
        self.dir = directory
        self.pki = pki
        self.kubeconfigs = kubeconfigs
        self.deadline = deadline

    def control_plane(
        self, api: AdminApi, ports: Mapping[str, int], pod_cidr: str, kwok_fallback_cidr: str, audit_log: Path
    ) -> None:
        """etcd, kube-apiserver (until /readyz), controller-manager, scheduler, kwok's CRDs and kwok."""
        bins, kubeconfigs, wait = self.bins, self.kubeconfigs, self.processes.wait
        kwok_config = self.dir / "kwok-stages.yaml"
        kwok_config.write_text(kwok_stages(DEFAULT_IMAGES))
        audit_policy = self.dir / "audit-policy.yaml"
        audit_policy.write_text(AUDIT_POLICY)
        self.processes.start(
            "etcd", etcd_argv(bins, self.dir / "etcd-data", ports["etcd"], ports["etcd_peer"])
        )
        wait(lambda: port_open(ports["etcd"]), self.deadline, "etcd", "etcd to listen")
        apiserver = apiserver_argv(
            bins,
            etcd_port=ports["etcd"],
            port=ports["apiserver"],
            pki=self.pki,
            cert_dir=self.dir / "apiserver-certs",
            audit_policy=audit_policy,
            audit_log=audit_log,
        )
        self.processes.start("kube-apiserver", apiserver)
        wait(api.ready, self.deadline, "kube-apiserver", "kube-apiserver /readyz")
        self.processes.start(
            "kube-controller-manager",
            controller_manager_argv(
                bins, kubeconfigs / "kube-controller-manager.kubeconfig", self.pki, pod_cidr
            ),
        )
        self.processes.start(
            "kube-scheduler", scheduler_argv(bins, kubeconfigs / "kube-scheduler.kubeconfig")
        )
        self._apply_kwok_crds(api)
        self.processes.start(
            "kwok",
            kwok_argv(bins, kubeconfigs / "kwok.kubeconfig", kwok_config, kwok_fallback_cidr, ports["kwok"]),
        )

    def _apply_kwok_crds(self, api: AdminApi) -> None:
        """kwok's Logs/Exec/PortForward CRDs (build.sh keeps them beside kwok), before kwok watches them."""
        import yaml  # noqa: PLC0415 - only `up` needs PyYAML

        for crd in sorted((self.bins / "kwok-crds").glob("*.yaml")):
            api.apply(yaml.safe_load(crd.read_text()))

    def node_agents(self, api: AdminApi) -> None:
        """The default StorageClass and its provisioner, and the pod runner (the kubelet of the pods that run
        for real). Both are this package's modules, run by this Python."""
        from specdeploy_localcluster.provisioner import storage_class_manifest  # noqa: PLC0415 (kubernetes)

        api.apply(storage_class_manifest())
        self.processes.start(
            "provisioner",
            [
                sys.executable,
                "-m",
                "specdeploy_localcluster.provisioner",
                f"--kubeconfig={self.kubeconfigs / 'provisioner.kubeconfig'}",
                f"--dir={self.dir / 'volumes'}",
            ],
        )
        self.processes.start(
            "pod-runner",
            [
                sys.executable,
                "-m",
                "specdeploy_localcluster.podrunner",
                f"--kubeconfig={self.kubeconfigs / 'pod-runner.kubeconfig'}",
                f"--dir={self.dir / 'pods'}",
                f"--node-ip={NODE_IP}",
            ],
        )

    def lws_objects(self, api: AdminApi) -> list[str]:
        """The LeaderWorkerSet controller's CRDs and RBAC, applied as soon as the apiserver serves: the CRDs
        (over 1 MB each) are Established while the rest of the cluster starts. Returns the CRDs' names."""
        objects = lws_objects(self.bins)
        for obj in objects:
            api.apply(obj)
        return [o["metadata"]["name"] for o in objects if o["kind"] == "CustomResourceDefinition"]

    def lws_controller(self, api: AdminApi, webhook_port: int, crds: Iterable[str]) -> None:
        """The LeaderWorkerSet controller once its `crds` are Established (`lws_objects`): the process
        (webhooks on 127.0.0.1 with a serving certificate of the cluster CA), then its webhook configurations;
        waited for until the apiserver gets answers from its LeaderWorkerSet and pod webhooks (dry-run
        creates)."""
        import yaml  # noqa: PLC0415 - only `up` needs PyYAML

        # Established before the controller starts: it would otherwise wait 10 s to watch them again.
        for crd in crds:
            self.processes.wait(
                functools.partial(crd_established, api, crd), self.deadline, "kube-apiserver", f"CRD {crd}"
            )
        lws_dir = self.dir / "lws"
        cert_dir = lws_dir / "certs"
        cert_dir.mkdir(parents=True, exist_ok=True)
        for suffix in ("crt", "key"):
            target = cert_dir / f"tls.{suffix}"
            target.write_bytes((self.pki / f"{LWS_WEBHOOK_SERVING.file}.{suffix}").read_bytes())
            target.chmod(0o600)
        config = lws_dir / "config.yaml"
        config.write_text(yaml.safe_dump(lws_config(cert_dir, webhook_port), sort_keys=False))
        self.processes.start(
            "lws-controller", lws_argv(self.bins, config, self.kubeconfigs / "lws-controller.kubeconfig")
        )
        wait = self.processes.wait
        wait(lambda: port_open(webhook_port), self.deadline, "lws-controller", "the LWS webhooks to listen")
        ca_bundle = base64.b64encode((self.pki / "ca.crt").read_bytes()).decode()
        for obj in webhook_configurations(self.bins, webhook_port, ca_bundle):
            api.apply(obj)
        wait(functools.partial(lws_webhooks_answer, api), self.deadline, "lws-controller", "the LWS webhooks")

    def autoscaling(self, api: AdminApi, ports: Mapping[str, int], pools: Iterable[AutoscaledPool]) -> None:
        """Prometheus (configured from the chart's PodMonitor), prometheus-adapter (from the chart's rules)
        behind the custom metrics APIServices, and the Cluster Autoscaler, each waited for."""
        bins, pki, kubeconfigs, wait = self.bins, self.pki, self.kubeconfigs, self.processes.wait
        for obj in autoscaling_objects(pools, ports["metrics_adapter"]):
            api.apply(obj)
        chart = render_chart_metrics(bins / "helm")
        prometheus_dir = self.dir / "prometheus"
        prometheus_dir.mkdir(exist_ok=True)
        prometheus_yaml = prometheus_dir / "prometheus.yaml"
        (prometheus_dir / RULES_DIR).mkdir(exist_ok=True)
        write_operator_targets(prometheus_dir / OPERATOR_TARGETS, None)
        write_config(
            prometheus_yaml,
            prometheus_config(
                chart.podmonitor,
                kubeconfigs / "prometheus.kubeconfig",
                rules_dir=prometheus_dir / RULES_DIR,
                operator_targets=prometheus_dir / OPERATOR_TARGETS,
            ),
        )
        adapter_rules = self.dir / "prometheus-adapter-rules.yaml"
        adapter_rules.write_text(chart.adapter_config)
        self.processes.start(
            "prometheus", prometheus_argv(bins, prometheus_yaml, prometheus_dir / "data", ports["prometheus"])
        )
        prometheus_url = f"http://127.0.0.1:{ports['prometheus']}"
        wait(lambda: prometheus_ready(prometheus_url), self.deadline, "prometheus", "Prometheus to be ready")
        self.processes.start(
            "metrics-adapter",
            adapter_argv(
                bins,
                kubeconfig=kubeconfigs / "metrics-adapter.kubeconfig",
                config_file=adapter_rules,
                prometheus_port=ports["prometheus"],
                port=ports["metrics_adapter"],
                cert=pki / "metrics-adapter-serving.crt",
                key=pki / "metrics-adapter-serving.key",
            ),
        )
        ca_kubeconfig = kubeconfigs / "cluster-autoscaler.kubeconfig"
        self.processes.start(
            "cluster-autoscaler",
            cluster_autoscaler_argv(bins, ca_kubeconfig, ports["cluster_autoscaler"]),
            env=cluster_autoscaler_env(ca_kubeconfig),
        )
        wait(
            lambda: port_open(ports["metrics_adapter"]),
            self.deadline,
            "metrics-adapter",
            "the adapter to listen",
        )
        ca_bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        for obj in custom_metrics_apiservices(ports["metrics_adapter"], ca_bundle):
            api.apply(obj)
        for name in CUSTOM_METRICS_APISERVICES:
            wait(
                functools.partial(apiservice_available, api, name),
                self.deadline,
                "metrics-adapter",
                f"APIService {name} to be Available",
            )
        # The autoscaler's status ConfigMap says Running once its first loop is through (it is written as
        # Initializing at start): the kwok provider has loaded its node groups and it watches the cluster.
        wait(
            functools.partial(autoscaler_running, api),
            self.deadline,
            "cluster-autoscaler",
            "the Cluster Autoscaler's first loop",
        )


def prometheus_ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=3) as resp:
            return bool(resp.status == 200)
    except (OSError, urllib.error.URLError):
        return False


def crd_established(api: AdminApi, name: str) -> bool:
    try:
        crd = api.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    except urllib.error.HTTPError:
        return False
    conditions = (crd.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)


def lws_webhooks_answer(api: AdminApi, namespace: str = "default") -> bool:
    """Whether the apiserver reaches the LWS controller's LeaderWorkerSet and pod webhooks: dry-run creates
    come back mutated by them (a CRD not yet established, or a webhook not yet reached, is an error)."""
    dry = "?dryRun=All"
    try:
        lws = api.request(
            "POST",
            f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{namespace}/leaderworkersets{dry}",
            probe_leaderworkerset(_LWS_PROBE),
        )
        pod = api.request("POST", f"/api/v1/namespaces/{namespace}/pods{dry}", probe_leader_pod(_LWS_PROBE))
    except (OSError, urllib.error.URLError):
        return False
    return webhooks_answered(lws, pod)


def apiservice_available(api: AdminApi, name: str) -> bool:
    try:
        obj = api.request("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{name}")
    except urllib.error.HTTPError:
        return False
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)


def autoscaler_running(api: AdminApi) -> bool:
    path = f"/api/v1/namespaces/{AUTOSCALING_NAMESPACE}/configmaps/cluster-autoscaler-status"
    try:
        status = str((api.request("GET", path).get("data") or {}).get("status", ""))
    except urllib.error.HTTPError:
        return False
    return "autoscalerStatus: Running" in status


def stop(processes: ComponentProcesses, timeout: float) -> list[str]:
    """Stop every process of the cluster (STOP_WAVES) and remove what the start wrote besides logs, pids, PKI
    and kubeconfigs; returns the components that were running."""
    stopped = processes.stop_waves(STOP_WAVES, timeout)
    for name in _STARTUP_STATE:
        path = processes.dir / name
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
    return stopped
