"""A real local Kubernetes control plane with simulated GPU node pools, without Docker.

Runs etcd, kube-apiserver (TLS, RBAC, client-certificate admin), kube-controller-manager, kube-scheduler,
kwok and the LeaderWorkerSet controller as background processes on 127.0.0.1, from binaries that
``build.sh`` builds from published Go modules. Node pools (GPU capacity, GPU labels, the GPU taint) come
from a YAML file; kwok plays the kubelet of every node with the Stages in ``stages/``.

`LocalCluster` is one cluster and its directory: what the tests' fixture (tests/conftest.py) and the
benchmarks use, and what ``python -m specdeploy_localcluster up|down|status`` (cli.py) drives. startup.py
starts and stops its processes; this module prepares its directory, reaches its API and shapes its nodes.

Only the standard library is needed for ``down`` and ``status``; ``up`` also needs ``cryptography`` and
``PyYAML`` (both in the project's virtualenv).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from specdeploy_localcluster.adminapi import FIELD_MANAGER, AdminApi
from specdeploy_localcluster.autoscalingstack import (
    AUTOSCALING_CLIENTS,
    METRICS_ADAPTER_SERVING,
    autoscaler_loops,
)
from specdeploy_localcluster.components import ClusterError, ComponentProcesses
from specdeploy_localcluster.controlplane import APISERVER_SERVING, CONTROL_PLANE_CLIENTS
from specdeploy_localcluster.lwscontroller import LWS_CLIENT, LWS_WEBHOOK_SERVING
from specdeploy_localcluster.metricsstack import prometheus_query, prometheus_targets
from specdeploy_localcluster.nodepools import (
    DEFAULT_NODEPOOLS,
    NODE_GROUP_LABEL,
    NodePool,
    load_autoscaled_pools,
    load_nodepools,
    node_manifests,
)
from specdeploy_localcluster.paths import HARNESS_DIR
from specdeploy_localcluster.pki import kubeconfig_text, write_pki
from specdeploy_localcluster.podnet import claim_slot, release_slot, slot_ranges
from specdeploy_localcluster.processes import port_open, retry_on_taken_port
from specdeploy_localcluster.startup import (
    AUTOSCALING_COMPONENTS,
    COMPONENTS,
    LWS_COMPONENTS,
    Startup,
    choose_ports,
    stop,
)

__all__ = [
    "AUTOSCALING_ENV",
    "LWS_ENV",
    "ClusterError",
    "LocalCluster",
    "autoscaling_from_env",
    "build_binaries",
    "lws_from_env",
]

AUTOSCALING_ENV = "SPECDEPLOY_AUTOSCALING"
LWS_ENV = "SPECDEPLOY_LWS"
IDENTITIES = (*CONTROL_PLANE_CLIENTS, LWS_CLIENT, *AUTOSCALING_CLIENTS)
_OFF = ("0", "false", "no", "off")

log = logging.getLogger("localcluster")


def autoscaling_from_env() -> bool:
    """Whether local clusters run the metrics adapter and the Cluster Autoscaler: yes unless
    ``SPECDEPLOY_AUTOSCALING`` is ``0``, ``false``, ``no`` or ``off``."""
    return os.environ.get(AUTOSCALING_ENV, "1").strip().lower() not in _OFF


def lws_from_env() -> bool:
    """Whether local clusters run the LeaderWorkerSet controller: yes unless ``SPECDEPLOY_LWS`` is ``0``,
    ``false``, ``no`` or ``off``."""
    return os.environ.get(LWS_ENV, "1").strip().lower() not in _OFF


def build_binaries(*what: str) -> Path:
    """The directory of the pinned binaries, after `build.sh what...` built what was missing of them
    (`core`, `autoscaling`, `cluster`, `promtool`, `keda-crds`; nothing: all; a cache hit is instant)."""
    out = subprocess.run(
        [str(HARNESS_DIR / "build.sh"), *what], check=True, stdout=subprocess.PIPE, text=True
    )
    return Path(out.stdout.strip().splitlines()[-1])


class LocalCluster:
    """One local control plane whose state (PKI, etcd data, logs, pids, kubeconfig) lives in ``directory``.

    ``autoscaling`` (default: on unless the environment says ``SPECDEPLOY_AUTOSCALING=0``) adds the custom
    metrics stack (Prometheus scraping the serving pods, prometheus-adapter behind the APIServices
    ``v1beta1``/``v1beta2.custom.metrics.k8s.io``, both configured from the chart: metricsstack.py) and the
    Cluster Autoscaler (kwok cloud provider, node groups from the node-pools file's ``autoscaledPools``).

    ``lws`` (default: on unless ``SPECDEPLOY_LWS=0``) runs the LeaderWorkerSet controller with its CRDs and
    its webhooks, which the apiserver reaches on 127.0.0.1 (lwscontroller.py)."""

    def __init__(
        self,
        directory: Path,
        nodepools: Path | None = None,
        bin_dir: Path | None = None,
        autoscaling: bool | None = None,
        lws: bool | None = None,
    ) -> None:
        self.dir = directory.resolve()
        self.nodepools_file = nodepools or DEFAULT_NODEPOOLS
        self._bin_dir = bin_dir
        self.autoscaling = autoscaling_from_env() if autoscaling is None else autoscaling
        self.lws = lws_from_env() if lws is None else lws
        self.processes = ComponentProcesses(self.dir)
        self.pki = self.dir / "pki"
        self.logs = self.processes.logs
        self.pids = self.processes.pids
        self.state_file = self.dir / "state.json"

    # -- paths ------------------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        return self.dir / "kubeconfig"

    @property
    def kubeconfigs(self) -> Path:
        """One kubeconfig per client identity (`<identity>.kubeconfig`)."""
        return self.dir / "kubeconfigs"

    @property
    def operator_kubeconfig(self) -> Path:
        """Kubeconfig of the operator's identity (user `specdeploy-operator`, cluster admin)."""
        return self.kubeconfigs / "operator.kubeconfig"

    @property
    def audit_log(self) -> Path:
        """JSON-lines audit log of every request the operator's identity makes (metadata level)."""
        return self.logs / "audit.log"

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
        return (
            COMPONENTS
            + (LWS_COMPONENTS if self.lws else ())
            + (AUTOSCALING_COMPONENTS if self.autoscaling else ())
        )

    @property
    def bin_dir(self) -> Path:
        if self._bin_dir is None:
            env = os.environ.get("SPECDEPLOY_BIN_DIR")
            if env:
                self._bin_dir = Path(env)
            else:
                # what this cluster runs; the tests' tools are built when asked for
                self._bin_dir = build_binaries("core", *(["autoscaling"] if self.autoscaling else []))
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

    # -- API access (stdlib only) -----------------------------------------------------------------------
    def _admin(self) -> AdminApi:
        return AdminApi(self.server, self.pki)

    def api(
        self, method: str, path: str, body: Any = None, timeout: float = 10.0, content_type: str | None = None
    ) -> Any:
        """One request as the cluster's admin; a PATCH is a server-side apply unless `content_type` says
        otherwise (`application/merge-patch+json`)."""
        return self._admin().request(method, path, body, timeout, content_type)

    def apiserver_ready(self) -> bool:
        return self._admin().ready()

    def _running(self) -> dict[str, int]:
        """The pid of each of the cluster's processes that runs now."""
        return self.processes.running(COMPONENTS + LWS_COMPONENTS + AUTOSCALING_COMPONENTS)

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
        """Start everything (or nothing, if this cluster is already up and healthy), then apply node pools.
        A port taken between its choice and its bind starts everything again on other ports."""
        if self.healthy():
            log.info("cluster in %s is already running", self.dir)
            self.apply_nodepools(load_nodepools(self.nodepools_file))
            self.wait_nodes_ready(timeout=timeout)
            return
        if self._running():
            log.info("cluster in %s is half up: stopping it first", self.dir)
        self.down()
        bins = self.bin_dir
        retry_on_taken_port(lambda: self._start(bins, timeout), undo=self.down)
        log.info("cluster up: kubeconfig %s", self.kubeconfig)

    def _start(self, bins: Path, timeout: float) -> None:
        try:
            self._start_once(bins, time.monotonic() + timeout)
        except ClusterError:
            # A component that failed because another could not bind its port (the apiserver, when etcd's
            # port was taken by something that listens): start again all the same.
            self.processes.raise_if_port_taken()
            raise

    def _start_once(self, bins: Path, deadline: float) -> None:
        for sub in (self.logs, self.pids, self.kubeconfigs):
            sub.mkdir(parents=True, exist_ok=True)
        write_pki(
            self.pki,
            servers=(APISERVER_SERVING, METRICS_ADAPTER_SERVING, LWS_WEBHOOK_SERVING),
            clients=IDENTITIES,
        )
        ports = choose_ports(self.autoscaling, self.lws)
        slot = claim_slot(self.dir)
        pod_cidr, kwok_fallback_cidr = slot_ranges(slot)
        state = {
            "ports": ports,
            "bin_dir": str(bins),
            "autoscaling": self.autoscaling,
            "lws": self.lws,
            "pod_network_slot": slot,
            "pod_cidr": pod_cidr,
        }
        self.state_file.write_text(json.dumps(state, indent=2))
        for identity in IDENTITIES:
            (self.kubeconfigs / f"{identity.file}.kubeconfig").write_text(
                kubeconfig_text(self.server, self.pki, identity)
            )
        self.kubeconfig.write_text((self.kubeconfigs / "admin.kubeconfig").read_text())
        self.kubeconfig.chmod(0o600)

        api = self._admin()
        start = Startup(
            self.processes,
            bins=bins,
            directory=self.dir,
            pki=self.pki,
            kubeconfigs=self.kubeconfigs,
            deadline=deadline,
        )
        start.control_plane(api, ports, pod_cidr, kwok_fallback_cidr, self.audit_log)
        lws_crds = start.lws_objects(api) if self.lws else []
        start.node_agents(api)
        for name in COMPONENTS:
            self.processes.expect_alive(name)
        self.apply_nodepools(load_nodepools(self.nodepools_file))
        # The controller-manager is doing real work once it has made the default ServiceAccount.
        self.processes.wait(
            lambda: api.exists("/api/v1/namespaces/default/serviceaccounts/default"),
            deadline,
            "kube-controller-manager",
            "the default ServiceAccount (controller-manager)",
        )
        self.wait_nodes_ready(timeout=max(5.0, deadline - time.monotonic()))
        if self.lws:
            start.lws_controller(api, ports["lws_webhook"], lws_crds)
        if self.autoscaling:
            start.autoscaling(api, ports, load_autoscaled_pools(self.nodepools_file))

    def down(self, timeout: float = 15.0) -> None:
        """Stop every process of this cluster (process groups), wait for them, remove its state (the logs
        stay)."""
        self.processes.stop_client("operator")  # `make demo` leaves the operator running against this cluster
        stopped = stop(self.processes, timeout)
        release_slot(self.dir)
        for sub in (self.pids, self.pki, self.kubeconfigs):
            shutil.rmtree(sub, ignore_errors=True)
        for f in (self.state_file, self.kubeconfig):
            with contextlib.suppress(FileNotFoundError):
                f.unlink()
        if stopped:
            log.info("stopped %s", ", ".join(sorted(stopped)))

    # -- faults (the reliability campaign) --------------------------------------------------------------
    def stop_component(self, name: str, timeout: float = 15.0) -> None:
        """Stop one process of the cluster (SIGTERM, SIGKILL after `timeout`), as when it crashes or its
        node goes away; its data (etcd's, the PKI) stays, and `start_component` brings it back."""
        self.processes.stop(name, timeout)

    def start_component(self, name: str, timeout: float = 60.0) -> None:
        """Start a stopped process again with the command line it had, and wait until it serves (etcd: its
        client port; kube-apiserver: /readyz)."""
        self.processes.restart(name)
        deadline = time.monotonic() + timeout
        if name == "etcd":
            port = self.state()["ports"]["etcd"]
            self.processes.wait(lambda: port_open(port), deadline, name, "etcd to listen")
        elif name == "kube-apiserver":
            self.processes.wait(self.apiserver_ready, deadline, name, "the apiserver to be ready")

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

    # -- nodes ------------------------------------------------------------------------------------------
    def apply_nodepools(self, pools: Iterable[NodePool]) -> list[str]:
        """Create or update (server-side apply) the nodes of the pools. Returns the node names."""
        api = self._admin()
        names = []
        for node in node_manifests(pools):
            name = node["metadata"]["name"]
            status = node.pop("status")
            path = f"/api/v1/nodes/{name}?fieldManager={FIELD_MANAGER}&force=true"
            if api.exists(f"/api/v1/nodes/{name}"):
                api.request("PATCH", path, node)
            else:
                # Node status (capacity) may be set on create; kwok keeps it from then on.
                api.request("POST", "/api/v1/nodes", {**node, "status": status})
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
        raise ClusterError(
            f"nodes not Ready after {timeout:.0f}s: {pending}\n{self.processes.log_tail('kwok')}"
        )

    def autoscaled_nodes(self, pool: str | None = None) -> list[dict[str, Any]]:
        """Nodes the Cluster Autoscaler made (of one autoscaled pool, or of any)."""
        selector = NODE_GROUP_LABEL if pool is None else f"{NODE_GROUP_LABEL}={pool}"
        query = urllib.parse.urlencode({"labelSelector": selector})
        items: list[dict[str, Any]] = self.api("GET", f"/api/v1/nodes?{query}")["items"]
        return items

    def autoscaler_loops(self) -> int:
        """How many main loops the Cluster Autoscaler has finished (from its own /metrics): a test waits for
        more loops, not for seconds."""
        port = self.state()["ports"]["cluster_autoscaler"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            return autoscaler_loops(resp.read().decode())

    # -- metrics ----------------------------------------------------------------------------------------
    def prometheus_metric(self, promql: str, at: float | None = None) -> list[tuple[dict[str, str], float]]:
        """An instant query of the cluster's Prometheus, now or at the Unix time `at`: (labels, value) per
        series."""
        return prometheus_query(self.state()["ports"]["prometheus"], promql, at)

    def prometheus_targets(self) -> list[dict[str, Any]]:
        """Prometheus' active scrape targets (the serving pods it discovered), with health and labels."""
        return prometheus_targets(self.state()["ports"]["prometheus"])
