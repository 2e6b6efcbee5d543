#!/usr/bin/env python3
"""A real local Kubernetes control plane with simulated GPU node pools, without Docker.

Runs etcd, kube-apiserver (TLS, RBAC, client-certificate admin), kube-controller-manager, kube-scheduler
and kwok as background processes on 127.0.0.1, from binaries that ``build.sh`` builds from published Go
modules. Node pools (GPU capacity, GPU labels, the GPU taint) come from a YAML file; kwok plays the kubelet
of every node with the Stages in ``stages/``.

Used two ways:
  * ``localcluster.py up|down|status|nodes`` (what ``make cluster-up`` / ``make cluster-down`` run);
  * ``LocalCluster`` from Python (the pytest fixture in ``tests/integration/conftest.py``).

Only the standard library is needed for ``down`` and ``status``; ``up`` also needs ``cryptography`` and
``PyYAML`` (both in the project's virtualenv).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metricsstack import (
    PROMETHEUS_USER,
    adapter_argv,
    prometheus_argv,
    prometheus_config,
    prometheus_query,
    prometheus_rbac,
    prometheus_targets,
    render_chart_metrics,
    write_config,
)
from podnet import NODE_POD_CIDR_MASK, claim_slot, release_slot, slot_ranges
from podrunner.selection import DEFAULT_IMAGES, KWOK_CRDS, kwok_skip_expression

HERE = Path(__file__).resolve().parent
DEFAULT_NODEPOOLS = HERE / "nodepools.yaml"
STAGES = (HERE / "stages" / "nodes.yaml", HERE / "stages" / "pods.yaml")
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
POOL_LABEL = "specdeploy.dev/node-pool"
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
AUTOSCALING_ENV = "SPECDEPLOY_AUTOSCALING"

# The address plan (docs/local-cluster.md): nothing of the local cluster is ever reached at an address off
# this machine. Every simulated node reports NODE_IP as its InternalIP and kwok's kubelet-API server port as
# its kubelet port, so the apiserver's `logs`/`exec`/`port-forward`/proxy connections land on kwok. Pod IPs
# come from podnet.POD_NETWORK (198.18.0.0/15), which this machine keeps to itself (podnet.py: a blackhole
# route, a network namespace per real pod): the controller-manager gives each node a /25 of the cluster's
# slot (node IPAM), kwok hands out the bottom of a node's range to the pods it simulates, the pod runner the
# top. Service ClusterIPs stay in SERVICE_CIDR, where the apiserver wants them: nothing connects to a
# ClusterIP here (no kube-proxy; clients follow EndpointSlices).
NODE_IP = "127.0.0.1"
SERVICE_CIDR = "10.96.0.0/16"

# Nodes of an autoscaled pool carry this label (value: the pool's name); the Cluster Autoscaler's kwok
# provider groups its node templates by it (`nodegroups.fromNodeLabelKey`).
NODE_GROUP_LABEL = "specdeploy.dev/node-group"
# The kwok provider marks every node it creates with its node group's name under this annotation.
CA_NODE_GROUP_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/name"
CA_MIN_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/min-count"
CA_MAX_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/max-count"
# Where the Cluster Autoscaler's ConfigMaps (provider config, node templates, its status) and the custom
# metrics APIService's Service live.
AUTOSCALING_NAMESPACE = "kube-system"
CA_CONFIGMAP = "kwok-provider-config"
CA_TEMPLATES_CONFIGMAP = "kwok-provider-templates"
METRICS_ADAPTER_USER = "specdeploy-metrics-adapter"
METRICS_ADAPTER_SERVICE = "specdeploy-metrics-adapter"
CUSTOM_METRICS_APISERVICES = ("v1beta1.custom.metrics.k8s.io", "v1beta2.custom.metrics.k8s.io")
CLUSTER_AUTOSCALER_USER = "specdeploy-cluster-autoscaler"

log = logging.getLogger("localcluster")


class ClusterError(RuntimeError):
    """The local cluster could not be started, reached or stopped."""


# --------------------------------------------------------------------------------------------------------
# Node pools (pure)
# --------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuSpec:
    product: str
    count: int
    memory_mib: int | None = None
    resource: str = "nvidia.com/gpu"


@dataclass(frozen=True)
class NodePool:
    name: str
    nodes: int
    instance_type: str
    cpu: str = "32"
    memory: str = "128Gi"
    pods: int = 110
    gpu: GpuSpec | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] | None = None  # None: the default for the pool's kind

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> NodePool:
        known = {"name", "nodes", "instanceType", "cpu", "memory", "pods", "gpu", "labels", "taints"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ClusterError(f"node pool {raw.get('name', '?')!r}: unknown field(s) {', '.join(unknown)}")
        for key in ("name", "nodes", "instanceType"):
            if key not in raw:
                raise ClusterError(f"node pool {raw.get('name', '?')!r}: field {key!r} is required")
        if not isinstance(raw["nodes"], int) or raw["nodes"] < 0:
            raise ClusterError(f"node pool {raw['name']!r}: nodes must be a non-negative integer")
        gpu = None
        if raw.get("gpu") is not None:
            g = raw["gpu"]
            if not isinstance(g.get("count"), int) or g["count"] <= 0 or not g.get("product"):
                raise ClusterError(f"node pool {raw['name']!r}: gpu needs a product and a positive count")
            gpu = GpuSpec(
                product=str(g["product"]),
                count=int(g["count"]),
                memory_mib=g.get("memoryMiB"),
                resource=str(g.get("resource", "nvidia.com/gpu")),
            )
        taints = raw.get("taints")
        return NodePool(
            name=str(raw["name"]),
            nodes=int(raw["nodes"]),
            instance_type=str(raw["instanceType"]),
            cpu=str(raw.get("cpu", "32")),
            memory=str(raw.get("memory", "128Gi")),
            pods=int(raw.get("pods", 110)),
            gpu=gpu,
            labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
            taints=None if taints is None else tuple(dict(t) for t in taints),
        )


@dataclass(frozen=True)
class AutoscaledPool:
    """A node pool that starts with `min_nodes` nodes and that the Cluster Autoscaler grows up to `max_nodes`
    (and shrinks back) with nodes made from its template."""

    pool: NodePool
    min_nodes: int
    max_nodes: int

    @property
    def name(self) -> str:
        return self.pool.name

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> AutoscaledPool:
        name = raw.get("name", "?")
        for key in ("minNodes", "maxNodes"):
            if key not in raw:
                raise ClusterError(f"autoscaled pool {name!r}: field {key!r} is required")
            if not isinstance(raw[key], int) or raw[key] < 0:
                raise ClusterError(f"autoscaled pool {name!r}: {key} must be a non-negative integer")
        if "nodes" in raw:
            raise ClusterError(f"autoscaled pool {name!r}: use minNodes/maxNodes, not nodes")
        if raw["maxNodes"] < raw["minNodes"] or raw["maxNodes"] == 0:
            raise ClusterError(f"autoscaled pool {name!r}: need 0 <= minNodes <= maxNodes and maxNodes > 0")
        rest = {k: v for k, v in raw.items() if k not in ("minNodes", "maxNodes")}
        pool = NodePool.from_dict({**rest, "nodes": 0})
        return AutoscaledPool(pool=pool, min_nodes=int(raw["minNodes"]), max_nodes=int(raw["maxNodes"]))


def _load_pools_doc(path: Path) -> dict[str, Any]:
    import yaml  # noqa: PLC0415 - only `up` needs PyYAML

    doc = yaml.safe_load(path.read_text()) or {}
    names = [p.get("name") for p in doc.get("pools") or []]
    names += [p.get("name") for p in doc.get("autoscaledPools") or []]
    if len(set(names)) != len(names):
        raise ClusterError(f"{path}: node pool names must be unique (pools and autoscaledPools), got {names}")
    return dict(doc)


def load_nodepools(path: Path) -> list[NodePool]:
    """The static pools (`pools:`): their nodes exist from the start and are never removed."""
    return [NodePool.from_dict(p) for p in _load_pools_doc(path).get("pools") or []]


def load_autoscaled_pools(path: Path) -> list[AutoscaledPool]:
    """The pools the Cluster Autoscaler manages (`autoscaledPools:`)."""
    return [AutoscaledPool.from_dict(p) for p in _load_pools_doc(path).get("autoscaledPools") or []]


def _node_manifest(pool: NodePool, name: str) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": pool.instance_type,
        POOL_LABEL: pool.name,
        "type": "kwok",
    }
    capacity = {"cpu": pool.cpu, "memory": pool.memory, "pods": str(pool.pods)}
    taints: list[Mapping[str, str]] = []
    if pool.gpu is not None:
        labels["nvidia.com/gpu.product"] = pool.gpu.product
        labels["nvidia.com/gpu.count"] = str(pool.gpu.count)
        labels["nvidia.com/gpu.present"] = "true"
        if pool.gpu.memory_mib is not None:
            labels["nvidia.com/gpu.memory"] = str(pool.gpu.memory_mib)
        capacity[pool.gpu.resource] = str(pool.gpu.count)
        taints = [GPU_TAINT]
    if pool.taints is not None:
        taints = list(pool.taints)
    labels.update(pool.labels)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]},
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
    }


def node_manifests(pools: Iterable[NodePool]) -> list[dict[str, Any]]:
    """The Node objects for the pools: capacity, GPU labels and taints as real GPU nodes carry them."""
    return [_node_manifest(pool, f"{pool.name}-{index}") for pool in pools for index in range(pool.nodes)]


def node_templates(pools: Iterable[AutoscaledPool]) -> list[dict[str, Any]]:
    """The Cluster Autoscaler's node templates (kwok provider), one per autoscaled pool: the same labels,
    capacity and taints as a static node of the same shape, plus the node-group label and the group's
    min/max annotations. The kwok provider copies a template's labels verbatim onto every node it makes,
    so the template has no `kubernetes.io/hostname`: a kwok Stage (stages/nodes.yaml) sets it to the node's
    name, as a kubelet would."""
    templates = []
    for autoscaled in pools:
        node = _node_manifest(autoscaled.pool, autoscaled.name)
        del node["metadata"]["labels"]["kubernetes.io/hostname"]
        node["metadata"]["labels"][NODE_GROUP_LABEL] = autoscaled.name
        node["metadata"]["annotations"].update(
            {CA_MIN_ANNOTATION: str(autoscaled.min_nodes), CA_MAX_ANNOTATION: str(autoscaled.max_nodes)}
        )
        templates.append(node)
    return templates


def kwok_provider_config(pools: Iterable[AutoscaledPool]) -> dict[str, Any]:
    """The kwok cloud provider's configuration (ConfigMap `kwok-provider-config`, key `config`): node groups
    from the templates ConfigMap, grouped by NODE_GROUP_LABEL, without the provider's own taint (our GPU
    taint stays), GPU types known by their product label."""
    products = sorted({p.pool.gpu.product for p in pools if p.pool.gpu is not None})
    nodes: dict[str, Any] = {"skipTaint": True}
    if products:
        nodes["gpuConfig"] = {
            "gpuLabelKey": "nvidia.com/gpu.product",
            "availableGPUTypes": {product: {} for product in products},
        }
    return {
        "apiVersion": "v1alpha1",
        "readNodesFrom": "configmap",
        "nodegroups": {"fromNodeLabelKey": NODE_GROUP_LABEL},
        "nodes": nodes,
        "configmap": {"name": CA_TEMPLATES_CONFIGMAP},
    }


# --------------------------------------------------------------------------------------------------------
# PKI
# --------------------------------------------------------------------------------------------------------


def _write_pki(pki: Path) -> None:
    """A cluster CA, the apiserver serving cert, client certs per component, SA keys, a front-proxy CA."""
    from cryptography import x509  # noqa: PLC0415
    from cryptography.hazmat.primitives import hashes, serialization  # noqa: PLC0415
    from cryptography.hazmat.primitives.asymmetric import ec  # noqa: PLC0415
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: PLC0415

    pki.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    later = now + dt.timedelta(days=365)

    def new_key() -> ec.EllipticCurvePrivateKey:
        return ec.generate_private_key(ec.SECP256R1())

    def save_key(name: str, key: ec.EllipticCurvePrivateKey) -> None:
        path = pki / f"{name}.key"
        path.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.TraditionalOpenSSL,
                serialization.NoEncryption(),
            )
        )
        path.chmod(0o600)

    def save_cert(name: str, cert: x509.Certificate) -> None:
        (pki / f"{name}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))

    def name_of(cn: str, org: str | None = None) -> x509.Name:
        attrs = [x509.NameAttribute(NameOID.COMMON_NAME, cn)]
        if org:
            attrs.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, org))
        return x509.Name(attrs)

    def make_ca(name: str, cn: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
        key = new_key()
        subject = name_of(cn)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        save_key(name, key)
        save_cert(name, cert)
        return key, cert

    def issue(
        name: str,
        ca: tuple[ec.EllipticCurvePrivateKey, x509.Certificate],
        cn: str,
        *,
        org: str | None = None,
        server: bool = False,
        dns_names: tuple[str, ...] = (
            "localhost",
            "kubernetes",
            "kubernetes.default",
            "kubernetes.default.svc",
            "kubernetes.default.svc.cluster.local",
        ),
        ips: tuple[str, ...] = ("127.0.0.1", "10.96.0.1", "::1"),
    ) -> None:
        key = new_key()
        builder = (
            x509.CertificateBuilder()
            .subject_name(name_of(cn, org))
            .issuer_name(ca[1].subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now)
            .not_valid_after(later)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH] if server else [ExtendedKeyUsageOID.CLIENT_AUTH]
                ),
                critical=False,
            )
        )
        if server:
            sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
            sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        save_key(name, key)
        save_cert(name, builder.sign(ca[0], hashes.SHA256()))

    ca = make_ca("ca", "specdeploy-local-ca")
    issue("apiserver", ca, "kube-apiserver", server=True)
    issue("admin", ca, "specdeploy-admin", org="system:masters")
    issue("kube-controller-manager", ca, "system:kube-controller-manager")
    issue("kube-scheduler", ca, "system:kube-scheduler")
    issue("kwok", ca, "kwok", org="system:masters")
    # The operator's own identity when it runs with admin rights (tests, demo): its requests are the only
    # ones the audit log records, which is how the benchmark counts them.
    # The operator, and the local cluster's node agents: the pod runner plays the kubelet of runnable pods,
    # the provisioner a storage driver; in system:masters like kwok, which plays the kubelet of the rest.
    for file, user in (
        ("operator", OPERATOR_USER),
        ("pod-runner", "specdeploy-pod-runner"),
        ("provisioner", "specdeploy-provisioner"),
    ):
        issue(file, ca, user, org="system:masters")
    # The custom metrics adapter: a client identity with only the RBAC it needs (see _autoscaling_objects),
    # and a serving certificate for the name the aggregator dials (<service>.<namespace>.svc).
    for file, user in (("metrics-adapter", METRICS_ADAPTER_USER), ("prometheus", PROMETHEUS_USER)):
        issue(file, ca, user)  # Prometheus discovers pods through the API (metricsstack.prometheus_rbac)
    service_host = f"{METRICS_ADAPTER_SERVICE}.{AUTOSCALING_NAMESPACE}.svc"
    issue(
        "metrics-adapter-serving",
        ca,
        service_host,
        server=True,
        dns_names=(service_host, f"{service_host}.cluster.local", "localhost"),
        ips=("127.0.0.1",),
    )
    # The Cluster Autoscaler reads almost everything and writes nodes, pods (evictions), its status ConfigMap
    # and events: a faithful ClusterRole would copy most of the upstream chart's. A test harness can accept
    # system:masters for it; its own user name still tells its requests apart.
    issue("cluster-autoscaler", ca, CLUSTER_AUTOSCALER_USER, org="system:masters")
    front = make_ca("front-proxy-ca", "specdeploy-front-proxy-ca")
    issue("front-proxy-client", front, "front-proxy-client")
    sa = new_key()
    save_key("sa", sa)
    (pki / "sa.pub").write_bytes(
        sa.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


OPERATOR_USER = "specdeploy-operator"

# Only the operator's identity is audited (metadata level, one line per request once it completes): the
# benchmark counts its API requests from this log, and nothing else pays for auditing.
AUDIT_POLICY = f"""apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived", "ResponseStarted"]
rules:
- level: Metadata
  users: ["{OPERATOR_USER}"]
- level: None
"""


def kwok_stages(runnable_images: Iterable[str] = ()) -> str:
    """kwok's Stages. With `runnable_images`, every pod Stage skips the pods the pod runner runs for real
    (podrunner/selection.py), so kwok neither readies, completes nor deletes them."""
    import yaml  # noqa: PLC0415 - only `up` needs PyYAML

    docs = [doc for path in STAGES for doc in yaml.safe_load_all(path.read_text()) if doc]
    images = list(runnable_images)
    if images:
        skip = kwok_skip_expression(images)
        for doc in docs:
            if doc["spec"]["resourceRef"]["kind"] == "Pod":
                doc["spec"]["selector"]["matchExpressions"].append(skip)
    return "\n---\n".join(yaml.safe_dump(doc, sort_keys=False) for doc in docs)


def _kubeconfig(server: str, ca: Path, cert: Path, key: Path, user: str) -> str:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "specdeploy-local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": "specdeploy-local", "context": {"cluster": "specdeploy-local", "user": user}}],
        "current-context": "specdeploy-local",
        "preferences": {},
    }
    return json.dumps(doc, indent=2) + "\n"  # JSON is YAML: every client reads it


def autoscaling_from_env() -> bool:
    """Whether local clusters run the metrics adapter and the Cluster Autoscaler: yes unless
    ``SPECDEPLOY_AUTOSCALING`` is ``0``, ``false``, ``no`` or ``off``."""
    return os.environ.get(AUTOSCALING_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_open(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def _wait_gone(pids: list[int], timeout: float) -> bool:
    """Wait until every process has fully exited. A zombie thread-group leader can still have threads (and
    listening sockets) being torn down, so "gone" means reaped: reap our own children, and wait for others'
    /proc entries to disappear (init reaps processes whose starter has exited)."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def _pid_start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22): with the pid,
    it identifies one process for good, so a recycled pid is never mistaken for ours."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


# --------------------------------------------------------------------------------------------------------
# The cluster
# --------------------------------------------------------------------------------------------------------


class LocalCluster:
    """One local control plane whose state (PKI, etcd data, logs, pids, kubeconfig) lives in ``directory``.

    ``autoscaling`` (default: on unless the environment says ``SPECDEPLOY_AUTOSCALING=0``) adds the custom
    metrics stack (Prometheus scraping the serving pods, prometheus-adapter behind the APIServices
    ``v1beta1``/``v1beta2.custom.metrics.k8s.io``, both configured from the chart: metricsstack.py) and the
    Cluster Autoscaler (kwok cloud provider, node groups from the node-pools file's ``autoscaledPools``)."""

    def __init__(
        self,
        directory: Path,
        nodepools: Path | None = None,
        bin_dir: Path | None = None,
        autoscaling: bool | None = None,
    ) -> None:
        self.dir = directory.resolve()
        self.nodepools_file = nodepools or DEFAULT_NODEPOOLS
        self._bin_dir = bin_dir
        self.autoscaling = autoscaling_from_env() if autoscaling is None else autoscaling
        self.pki = self.dir / "pki"
        self.logs = self.dir / "logs"
        self.pids = self.dir / "pids"
        self.state_file = self.dir / "state.json"

    # -- paths ------------------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def operator_kubeconfig(self) -> Path:
        """Kubeconfig of the operator's identity (user `specdeploy-operator`, cluster admin)."""
        return self.dir / "kubeconfigs" / "operator.kubeconfig"

    @property
    def audit_log(self) -> Path:
        """JSON-lines audit log of every request the operator's identity makes (metadata level)."""
        return self.dir / "logs" / "audit.log"

    @property
    def autoscaler_log(self) -> Path:
        """The Cluster Autoscaler's log (klog --v=1: scale-up decisions, unneeded nodes, node deletions)."""
        return self.logs / "cluster-autoscaler.log"

    @property
    def metrics_adapter_log(self) -> Path:
        return self.logs / "metrics-adapter.log"

    @property
    def components(self) -> tuple[str, ...]:
        """The processes this cluster runs, in start order."""
        return COMPONENTS + (AUTOSCALING_COMPONENTS if self.autoscaling else ())

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            env = os.environ.get("SPECDEPLOY_BIN_DIR")
            if env:
                self._bin_dir = Path(env)
            else:
                out = subprocess.run(
                    [str(HERE / "build.sh")], check=True, stdout=subprocess.PIPE, text=True
                ).stdout
                self._bin_dir = Path(out.strip().splitlines()[-1])
        return self._bin_dir

    def state(self) -> dict[str, Any]:
        try:
            loaded: dict[str, Any] = json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}
        return loaded

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.state()['ports']['apiserver']}"

    @property
    def prometheus_url(self) -> str:
        """Base URL of the cluster's Prometheus (plain HTTP on 127.0.0.1)."""
        if not self.autoscaling:
            raise ClusterError("this cluster runs without autoscaling (no metrics stack)")
        return f"http://127.0.0.1:{self.state()['ports']['prometheus']}"

    # -- processes --------------------------------------------------------------------------------------
    def _running(self) -> dict[str, int]:
        running: dict[str, int] = {}
        for name in COMPONENTS + AUTOSCALING_COMPONENTS:
            pid_file = self.pids / f"{name}.pid"
            try:
                pid_text, started = pid_file.read_text().split(":", 1)
                pid = int(pid_text)
            except (OSError, ValueError):
                continue
            if _pid_alive(pid) and _pid_start_time(pid) == started.strip():
                running[name] = pid
        return running

    def _start(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as out:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # survives `make cluster-up` exiting; its own process group
                env={**os.environ, **(env or {})},
                cwd=self.dir,
            )
        (self.pids / f"{name}.pid").write_text(f"{proc.pid}:{_pid_start_time(proc.pid)}")
        (self.pids / f"{name}.argv.json").write_text(json.dumps({"argv": argv, "env": dict(env or {})}))
        log.info("started %s pid=%d", name, proc.pid)

    # -- faults (the reliability campaign) --------------------------------------------------------------
    def stop_component(self, name: str, timeout: float = 15.0) -> None:
        """Stop one process of the cluster (SIGTERM, SIGKILL after `timeout`), as when it crashes or its
        node goes away; its data (etcd's, the PKI) stays, and `start_component` brings it back."""
        pid = self._running().get(name)
        if pid is None:
            raise ClusterError(f"{name} is not running")
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)
        if not _wait_gone([pid], timeout):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
            _wait_gone([pid], 5.0)

    def start_component(self, name: str, timeout: float = 60.0) -> None:
        """Start a stopped process again with the command line it had, and wait until it serves (etcd: its
        client port; kube-apiserver: /readyz)."""
        saved = json.loads((self.pids / f"{name}.argv.json").read_text())
        self._start(name, saved["argv"], saved["env"])
        deadline = time.monotonic() + timeout
        if name == "etcd":
            port = self.state()["ports"]["etcd"]
            self._wait(lambda: _port_open(port), deadline, name, "etcd to listen")
        elif name == "kube-apiserver":
            self._wait(self._apiserver_ready, deadline, name, "the apiserver to be ready")

    def compact_etcd(self) -> int:
        """Compact etcd's history up to its current revision (through etcd's HTTP gateway), so that a watch
        resumed from an older resourceVersion gets 410 Gone; returns the revision."""
        base = f"http://127.0.0.1:{self.state()['ports']['etcd']}/v3/kv"

        def post(path: str, body: dict[str, Any]) -> Any:
            req = urllib.request.Request(f"{base}/{path}", data=json.dumps(body).encode(), method="POST")
            with urllib.request.urlopen(req, timeout=10) as resp:
                return json.loads(resp.read())

        revision = int(post("range", {"key": base64.b64encode(b"/").decode()})["header"]["revision"])
        post("compaction", {"revision": revision, "physical": True})
        return revision

    def _expect_alive(self, name: str) -> None:
        if name not in self._running():
            tail = self._log_tail(name)
            raise ClusterError(f"{name} exited during start-up; last log lines:\n{tail}")

    def _log_tail(self, name: str, lines: int = 25) -> str:
        try:
            return "\n".join((self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    # -- API access (stdlib only) -----------------------------------------------------------------------
    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def api(
        self, method: str, path: str, body: Any = None, timeout: float = 10.0, content_type: str | None = None
    ) -> Any:
        """One request as the cluster's admin; a PATCH is a server-side apply unless `content_type` says
        otherwise (`application/merge-patch+json`)."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            if content_type is None:
                content_type = "application/apply-patch+yaml" if method == "PATCH" else "application/json"
            req.add_header("Content-Type", content_type)
        with urllib.request.urlopen(req, context=self._ssl(), timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw.strip().startswith(b"{") else raw.decode()

    def healthy(self) -> bool:
        running = self._running()
        if set(running) != set(self.components):
            return False
        try:
            return bool(self.api("GET", "/readyz", timeout=3) == "ok")
        except (OSError, urllib.error.URLError, ClusterError, KeyError):
            return False

    # -- lifecycle --------------------------------------------------------------------------------------
    def up(self, timeout: float = 120.0) -> None:
        """Start everything (or nothing, if this cluster is already up and healthy), then apply node pools."""
        if self.healthy():
            log.info("cluster in %s is already running", self.dir)
            self.apply_nodepools(load_nodepools(self.nodepools_file))
            self.wait_nodes_ready(timeout=timeout)
            return
        if self._running():
            log.info("cluster in %s is half up: stopping it first", self.dir)
        self.down()
        bins = self.bin_dir
        for sub in ("logs", "pids"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        _write_pki(self.pki)
        ports = {
            "etcd": free_port(),
            "etcd_peer": free_port(),
            "apiserver": free_port(),
            "kwok": free_port(),
        }
        if self.autoscaling:
            ports.update(prometheus=free_port(), metrics_adapter=free_port(), cluster_autoscaler=free_port())
        slot = claim_slot(self.dir)
        pod_cidr, kwok_fallback_cidr = slot_ranges(slot)
        self.state_file.write_text(
            json.dumps(
                {
                    "ports": ports,
                    "bin_dir": str(bins),
                    "autoscaling": self.autoscaling,
                    "pod_network_slot": slot,
                    "pod_cidr": pod_cidr,
                },
                indent=2,
            )
        )
        server = f"https://127.0.0.1:{ports['apiserver']}"
        kubeconfigs = self.dir / "kubeconfigs"
        kubeconfigs.mkdir(exist_ok=True)
        for user in (
            "admin",
            "kube-controller-manager",
            "kube-scheduler",
            "kwok",
            "pod-runner",
            "provisioner",
            "operator",
            "metrics-adapter",
            "prometheus",
            "cluster-autoscaler",
        ):
            text = _kubeconfig(
                server, self.pki / "ca.crt", self.pki / f"{user}.crt", self.pki / f"{user}.key", user
            )
            (kubeconfigs / f"{user}.kubeconfig").write_text(text)
        self.kubeconfig.write_text((kubeconfigs / "admin.kubeconfig").read_text())
        self.kubeconfig.chmod(0o600)
        kwok_config = self.dir / "kwok-stages.yaml"
        kwok_config.write_text(kwok_stages(DEFAULT_IMAGES))
        audit_policy = self.dir / "audit-policy.yaml"
        audit_policy.write_text(AUDIT_POLICY)

        deadline = time.monotonic() + timeout
        pki = self.pki
        self._start(
            "etcd",
            [
                str(bins / "etcd"),
                "--name=specdeploy",
                f"--data-dir={self.dir / 'etcd-data'}",
                f"--listen-client-urls=http://127.0.0.1:{ports['etcd']}",
                f"--advertise-client-urls=http://127.0.0.1:{ports['etcd']}",
                f"--listen-peer-urls=http://127.0.0.1:{ports['etcd_peer']}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{ports['etcd_peer']}",
                f"--initial-cluster=specdeploy=http://127.0.0.1:{ports['etcd_peer']}",
                "--unsafe-no-fsync=true",
                "--quota-backend-bytes=4294967296",
                "--log-level=warn",
            ],
        )
        self._wait(lambda: _port_open(ports["etcd"]), deadline, "etcd", "etcd to listen")
        self._start(
            "kube-apiserver",
            [
                str(bins / "kube-apiserver"),
                f"--etcd-servers=http://127.0.0.1:{ports['etcd']}",
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={ports['apiserver']}",
                f"--cert-dir={self.dir / 'apiserver-certs'}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                # Simulated nodes are reached at their InternalIP only (kwok, on loopback), never by name.
                "--kubelet-preferred-address-types=InternalIP",
                "--allow-privileged=true",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                "--api-audiences=https://kubernetes.default.svc.cluster.local",
                # API aggregation (custom metrics adapters register through it).
                f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
                "--requestheader-allowed-names=front-proxy-client",
                "--requestheader-username-headers=X-Remote-User",
                "--requestheader-group-headers=X-Remote-Group",
                "--requestheader-extra-headers-prefix=X-Remote-Extra-",
                f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
                f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
                # One user on loopback: no need for request throttling.
                "--enable-priority-and-fairness=false",
                "--max-requests-inflight=0",
                "--max-mutating-requests-inflight=0",
                "--profiling=false",
                f"--audit-policy-file={audit_policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-format=json",
                "--audit-log-mode=batch",
                "--audit-log-batch-max-wait=1s",
                "--audit-log-maxsize=512",
                "--v=1",
            ],
        )
        self._wait(self._apiserver_ready, deadline, "kube-apiserver", "kube-apiserver /readyz")
        self._start(
            "kube-controller-manager",
            [
                str(bins / "kube-controller-manager"),
                f"--kubeconfig={kubeconfigs / 'kube-controller-manager.kubeconfig'}",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--horizontal-pod-autoscaler-sync-period=5s",
                "--allocate-node-cidrs=true",
                f"--cluster-cidr={pod_cidr}",
                f"--node-cidr-mask-size={NODE_POD_CIDR_MASK}",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--v=1",
            ],
        )
        self._start(
            "kube-scheduler",
            [
                str(bins / "kube-scheduler"),
                f"--kubeconfig={kubeconfigs / 'kube-scheduler.kubeconfig'}",
                f"--authentication-kubeconfig={kubeconfigs / 'kube-scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={kubeconfigs / 'kube-scheduler.kubeconfig'}",
                "--bind-address=127.0.0.1",
                "--secure-port=0",
                "--leader-elect=false",
                "--v=1",
            ],
        )
        self._apply_kwok_crds(bins)
        self._start(
            "kwok",
            [
                str(bins / "kwok"),
                f"--kubeconfig={kubeconfigs / 'kwok.kubeconfig'}",
                f"--config={kwok_config}",
                f"--manage-nodes-with-annotation-selector={KWOK_ANNOTATION[0]}={KWOK_ANNOTATION[1]}",
                "--node-lease-duration-seconds=40",
                f"--cidr={kwok_fallback_cidr}",
                f"--node-ip={NODE_IP}",
                f"--node-port={ports['kwok']}",
                f"--server-address=127.0.0.1:{ports['kwok']}",
                # kubectl logs/exec/port-forward of the pod runner's pods (podrunner/kwokobjects.py).
                f"--enable-crds={','.join(KWOK_CRDS)}",
            ],
        )
        self._start_node_agents(kubeconfigs)
        for name in COMPONENTS:
            self._expect_alive(name)
        self.apply_nodepools(load_nodepools(self.nodepools_file))
        # The controller-manager is doing real work once it has made the default ServiceAccount.
        self._wait(
            lambda: self._exists("/api/v1/namespaces/default/serviceaccounts/default"),
            deadline,
            "kube-controller-manager",
            "the default ServiceAccount (controller-manager)",
        )
        self.wait_nodes_ready(timeout=max(5.0, deadline - time.monotonic()))
        if self.autoscaling:
            self._start_autoscaling(ports, deadline)
        log.info("cluster up: kubeconfig %s", self.kubeconfig)

    def _apply_kwok_crds(self, bins: Path) -> None:
        """kwok's Logs/Exec/PortForward CRDs (build.sh keeps them beside kwok), before kwok watches them."""
        import yaml  # noqa: PLC0415 - only `up` needs PyYAML

        for crd in sorted((bins / "kwok-crds").glob("*.yaml")):  # build.sh keeps them beside kwok
            self._apply(yaml.safe_load(crd.read_text()))

    def _start_node_agents(self, kubeconfigs: Path) -> None:
        """The default StorageClass and its provisioner, and the pod runner (the kubelet of the pods that run
        for real)."""
        from provisioner import storage_class_manifest  # noqa: PLC0415 (needs the kubernetes client)

        self._apply(storage_class_manifest())
        runner_env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))}
        self._start(
            "provisioner",
            [
                sys.executable,
                str(HERE / "provisioner.py"),
                f"--kubeconfig={kubeconfigs / 'provisioner.kubeconfig'}",
                f"--dir={self.dir / 'volumes'}",
            ],
        )
        self._start(
            "pod-runner",
            [
                sys.executable,
                "-m",
                "podrunner",
                f"--kubeconfig={kubeconfigs / 'pod-runner.kubeconfig'}",
                f"--dir={self.dir / 'pods'}",
                f"--node-ip={NODE_IP}",
            ],
            env=runner_env,
        )

    # -- autoscaling: custom metrics adapter and Cluster Autoscaler ---------------------------------------
    def _autoscaling_objects(self, ports: Mapping[str, int]) -> list[dict[str, Any]]:
        """What the adapter and the autoscaler need in the API before they start (RBAC, the ExternalName
        Service, the kwok provider's ConfigMaps), and the APIServices that route to the adapter."""
        pools = load_autoscaled_pools(self.nodepools_file)
        user = {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": METRICS_ADAPTER_USER}
        ca_bundle = base64.b64encode((self.pki / "ca.crt").read_bytes()).decode()
        objects: list[dict[str, Any]] = [
            # prometheus-adapter lists the objects a metric is asked for (pods, namespaces), like upstream's
            # chart lets it read every resource; it writes nothing.
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "specdeploy:metrics-adapter"},
                "rules": [{"apiGroups": ["*"], "resources": ["*"], "verbs": ["get", "list", "watch"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "specdeploy:metrics-adapter"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "specdeploy:metrics-adapter",
                },
                "subjects": [user],
            },
            # Delegated authentication and authorization of the requests the aggregator proxies to it.
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "specdeploy:metrics-adapter:auth-delegator"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "system:auth-delegator",
                },
                "subjects": [user],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": "specdeploy:metrics-adapter:auth-reader", "namespace": "kube-system"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "Role",
                    "name": "extension-apiserver-authentication-reader",
                },
                "subjects": [user],
            },
            # No kube-proxy here: the aggregator resolves an ExternalName Service to its name and dials it.
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": METRICS_ADAPTER_SERVICE, "namespace": AUTOSCALING_NAMESPACE},
                "spec": {
                    "type": "ExternalName",
                    "externalName": "127.0.0.1",
                    "ports": [{"name": "https", "port": ports["metrics_adapter"], "protocol": "TCP"}],
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
        for apiservice, priority in zip(CUSTOM_METRICS_APISERVICES, (100, 200), strict=True):
            version = apiservice.split(".", 1)[0]
            objects.append(
                {
                    "apiVersion": "apiregistration.k8s.io/v1",
                    "kind": "APIService",
                    "metadata": {"name": apiservice},
                    "spec": {
                        "group": "custom.metrics.k8s.io",
                        "version": version,
                        "groupPriorityMinimum": 100,
                        "versionPriority": priority,
                        "service": {
                            "namespace": AUTOSCALING_NAMESPACE,
                            "name": METRICS_ADAPTER_SERVICE,
                            "port": ports["metrics_adapter"],
                        },
                        # The adapter serves a certificate from the cluster CA for <service>.<namespace>.svc.
                        "caBundle": ca_bundle,
                    },
                }
            )
        return objects

    def _apply(self, obj: Mapping[str, Any]) -> None:
        """Server-side apply of one object (field manager specdeploy-localcluster)."""
        api_version, kind, meta = obj["apiVersion"], obj["kind"], obj["metadata"]
        prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        plural = {
            "ConfigMap": "configmaps",
            "Service": "services",
            "APIService": "apiservices",
            "StorageClass": "storageclasses",
        }.get(kind, kind.lower() + "s")
        namespace = f"/namespaces/{meta['namespace']}" if "namespace" in meta else ""
        path = f"{prefix}{namespace}/{plural}/{meta['name']}?fieldManager=specdeploy-localcluster&force=true"
        self.api("PATCH", path, obj)

    def _start_autoscaling(self, ports: Mapping[str, int], deadline: float) -> None:
        bins, pki, kubeconfigs = self.bin_dir, self.pki, self.dir / "kubeconfigs"
        objects = self._autoscaling_objects(ports)
        apiservices = [o for o in objects if o["kind"] == "APIService"]
        for obj in objects:
            if obj["kind"] != "APIService":
                self._apply(obj)
        chart = render_chart_metrics(bins / "helm")
        prometheus_dir = self.dir / "prometheus"
        prometheus_dir.mkdir(exist_ok=True)
        prometheus_yaml = prometheus_dir / "prometheus.yaml"
        scrape = prometheus_config(chart.podmonitor, kubeconfigs / "prometheus.kubeconfig")
        write_config(prometheus_yaml, scrape)
        adapter_rules = self.dir / "prometheus-adapter-rules.yaml"
        adapter_rules.write_text(chart.adapter_config)
        self._start(
            "prometheus", prometheus_argv(bins, prometheus_yaml, prometheus_dir / "data", ports["prometheus"])
        )
        self._wait(self._prometheus_ready, deadline, "prometheus", "Prometheus to be ready")
        self._start(
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
        self._start(
            "cluster-autoscaler",
            [
                str(bins / "cluster-autoscaler"),
                "--cloud-provider=kwok",
                f"--kubeconfig={ca_kubeconfig}",
                f"--namespace={AUTOSCALING_NAMESPACE}",
                f"--address=127.0.0.1:{ports['cluster_autoscaler']}",
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
            ],
            # The kwok provider reads KUBECONFIG in local mode and its ConfigMaps from POD_NAMESPACE.
            env={
                "KWOK_PROVIDER_MODE": "local",
                "KUBECONFIG": str(ca_kubeconfig),
                "POD_NAMESPACE": AUTOSCALING_NAMESPACE,
            },
        )
        self._wait(
            lambda: _port_open(ports["metrics_adapter"]), deadline, "metrics-adapter", "the adapter to listen"
        )
        for obj in apiservices:
            self._apply(obj)
        for name in CUSTOM_METRICS_APISERVICES:
            self._wait(
                lambda name=name: self._apiservice_available(name),
                deadline,
                "metrics-adapter",
                f"APIService {name} to be Available",
            )
        # The autoscaler's status ConfigMap says Running once its first loop is through (it is written as
        # Initializing at start): the kwok provider has loaded its node groups and it watches the cluster.
        self._wait(
            self._autoscaler_running, deadline, "cluster-autoscaler", "the Cluster Autoscaler's first loop"
        )

    def _apiservice_available(self, name: str) -> bool:
        try:
            obj = self.api("GET", f"/apis/apiregistration.k8s.io/v1/apiservices/{name}")
        except urllib.error.HTTPError:
            return False
        conditions = (obj.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Available" and c["status"] == "True" for c in conditions)

    def _autoscaler_running(self) -> bool:
        path = f"/api/v1/namespaces/{AUTOSCALING_NAMESPACE}/configmaps/cluster-autoscaler-status"
        try:
            status = str((self.api("GET", path).get("data") or {}).get("status", ""))
        except urllib.error.HTTPError:
            return False
        return "autoscalerStatus: Running" in status

    def _prometheus_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.prometheus_url}/-/ready", timeout=3) as resp:
                return bool(resp.status == 200)
        except (OSError, urllib.error.URLError):
            return False

    def prometheus_metric(self, promql: str) -> list[tuple[dict[str, str], float]]:
        """An instant query of the cluster's Prometheus: (labels, value) per series."""
        return prometheus_query(self.state()["ports"]["prometheus"], promql)

    def prometheus_targets(self) -> list[dict[str, Any]]:
        """Prometheus' active scrape targets (the serving pods it discovered), with health and labels."""
        return prometheus_targets(self.state()["ports"]["prometheus"])

    def autoscaled_nodes(self, pool: str | None = None) -> list[dict[str, Any]]:
        """Nodes the Cluster Autoscaler made (of one autoscaled pool, or of any)."""
        selector = NODE_GROUP_LABEL if pool is None else f"{NODE_GROUP_LABEL}={pool}"
        query = urllib.parse.urlencode({"labelSelector": selector})
        items: list[dict[str, Any]] = self.api("GET", f"/api/v1/nodes?{query}")["items"]
        return items

    def _apiserver_ready(self) -> bool:
        try:
            return bool(self.api("GET", "/readyz", timeout=3) == "ok")
        except (OSError, urllib.error.URLError):
            return False

    def _exists(self, path: str) -> bool:
        try:
            self.api("GET", path)
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return False
            raise
        return True

    def _wait(self, check: Any, deadline: float, component: str, what: str) -> None:
        while time.monotonic() < deadline:
            self._expect_alive(component)
            if check():
                return
            time.sleep(0.2)
        raise ClusterError(f"timed out waiting for {what}; last log lines:\n{self._log_tail(component)}")

    def apply_nodepools(self, pools: Iterable[NodePool]) -> list[str]:
        """Create or update (server-side apply) the nodes of the pools. Returns the node names."""
        names = []
        for node in node_manifests(pools):
            name = node["metadata"]["name"]
            status = node.pop("status")
            path = f"/api/v1/nodes/{name}?fieldManager=specdeploy-localcluster&force=true"
            if self._exists(f"/api/v1/nodes/{name}"):
                self.api("PATCH", path, node)
            else:
                # Node status (capacity) may be set on create; kwok keeps it from then on.
                self.api("POST", "/api/v1/nodes", {**node, "status": status})
            names.append(name)
        return names

    def delete_nodes(self, names: Iterable[str]) -> None:
        for name in names:
            with contextlib.suppress(urllib.error.HTTPError):
                self.api("DELETE", f"/api/v1/nodes/{name}")

    def wait_nodes_ready(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        pending: list[str] = []
        while time.monotonic() < deadline:
            nodes = self.api("GET", "/api/v1/nodes")["items"]
            pending = [
                n["metadata"]["name"]
                for n in nodes
                if not any(
                    c["type"] == "Ready" and c["status"] == "True"
                    for c in n.get("status", {}).get("conditions", [])
                )
            ]
            if not pending:
                return
            time.sleep(0.2)
        raise ClusterError(f"nodes not Ready after {timeout:.0f}s: {pending}\n{self._log_tail('kwok')}")

    def _stop_client(self, name: str) -> None:
        """Stop a process started against this cluster by someone else (`pids/<name>`: its pid, the leader
        of its own session), if it is still the same process."""
        try:
            pid = int((self.pids / name).read_text().split(":")[0])
        except (OSError, ValueError):
            return
        if _pid_alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGTERM)
            if not _wait_gone([pid], 15.0):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pid, signal.SIGKILL)

    def down(self, timeout: float = 15.0) -> None:
        """Stop every process of this cluster (process groups), wait for them, remove its state."""
        running = self._running()
        self._stop_client("operator")  # `make demo` leaves the operator running against this cluster
        # The autoscaler first, while the API is up (on exit it deletes the nodes it made), then everything
        # that talks to etcd, then etcd: an apiserver that loses etcd mid-shutdown hangs.
        waves = [list(AUTOSCALING_COMPONENTS), [n for n in COMPONENTS if n != "etcd"], ["etcd"]]
        for wave in waves:
            pids = [running[n] for n in wave if n in running]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGTERM)
            if not _wait_gone(pids, timeout):
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                _wait_gone(pids, 5.0)
        release_slot(self.dir)
        for sub in ("pids", "etcd-data", "pki", "kubeconfigs", "apiserver-certs", "prometheus"):
            shutil.rmtree(self.dir / sub, ignore_errors=True)
        for f in (self.state_file, self.kubeconfig, self.dir / "kwok-stages.yaml"):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        if running:
            log.info("stopped %s", ", ".join(sorted(running)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "command",
        choices=["up", "down", "status", "manifests", "kwok-config"],
        help="manifests: print the node pools' Node objects (for `kubectl apply -f -` on another cluster); "
        "kwok-config: print the kwok Stages",
    )
    parser.add_argument("--dir", type=Path, default=Path(".cluster"), help="state directory")
    parser.add_argument("--nodepools", type=Path, default=DEFAULT_NODEPOOLS, help="node pools YAML")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument(
        "--autoscaling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the custom metrics adapter and the Cluster Autoscaler "
        f"(default: on unless {AUTOSCALING_ENV}=0)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cluster = LocalCluster(args.dir, nodepools=args.nodepools, autoscaling=args.autoscaling)
    try:
        if args.command == "up":
            started = time.monotonic()
            cluster.up(timeout=args.timeout)
            print(f"local cluster ready in {time.monotonic() - started:.1f}s")
            print(f"  export KUBECONFIG={cluster.kubeconfig}")
        elif args.command == "down":
            cluster.down()
        elif args.command == "status":
            running = cluster._running()
            # A running cluster's own setting (state.json), whatever this environment says.
            if args.autoscaling is None and "autoscaling" in cluster.state():
                cluster.autoscaling = bool(cluster.state()["autoscaling"])
            for name in cluster.components:
                print(f"{name:<24} {'running pid ' + str(running[name]) if name in running else 'stopped'}")
            return 0 if cluster.healthy() else 1
        elif args.command == "manifests":
            items = node_manifests(load_nodepools(args.nodepools))
            print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2))
        elif args.command == "kwok-config":
            print(kwok_stages())
    except (ClusterError, subprocess.CalledProcessError, urllib.error.URLError) as err:
        print(f"localcluster {args.command}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
