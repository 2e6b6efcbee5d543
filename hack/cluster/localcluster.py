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
import json
import logging
import os
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from autoscalingstack import (
    AUTOSCALING_CLIENTS,
    AUTOSCALING_NAMESPACE,
    CUSTOM_METRICS_APISERVICES,
    METRICS_ADAPTER_SERVING,
    autoscaling_objects,
    cluster_autoscaler_argv,
    cluster_autoscaler_env,
    custom_metrics_apiservices,
)
from controlplane import (
    APISERVER_SERVING,
    AUDIT_POLICY,
    CONTROL_PLANE_CLIENTS,
    NODE_IP,
    apiserver_argv,
    controller_manager_argv,
    etcd_argv,
    kwok_argv,
    kwok_stages,
    scheduler_argv,
)
from metricsstack import (
    adapter_argv,
    prometheus_argv,
    prometheus_config,
    prometheus_query,
    prometheus_targets,
    render_chart_metrics,
    write_config,
)
from nodepools import (
    DEFAULT_NODEPOOLS,
    NODE_GROUP_LABEL,
    NodePool,
    NodePoolError,
    load_autoscaled_pools,
    load_nodepools,
    node_manifests,
)
from pki import kubeconfig_text, write_pki
from podnet import claim_slot, release_slot, slot_ranges
from podrunner.selection import DEFAULT_IMAGES
from processes import free_port, pid_alive, pid_start_time, port_open, stop_groups

HERE = Path(__file__).resolve().parent
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
IDENTITIES = CONTROL_PLANE_CLIENTS + AUTOSCALING_CLIENTS

log = logging.getLogger("localcluster")


class ClusterError(RuntimeError):
    """The local cluster could not be started, reached or stopped."""


def autoscaling_from_env() -> bool:
    """Whether local clusters run the metrics adapter and the Cluster Autoscaler: yes unless
    ``SPECDEPLOY_AUTOSCALING`` is ``0``, ``false``, ``no`` or ``off``."""
    return os.environ.get(AUTOSCALING_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


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
            if pid_alive(pid) and pid_start_time(pid) == started.strip():
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
        (self.pids / f"{name}.pid").write_text(f"{proc.pid}:{pid_start_time(proc.pid)}")
        (self.pids / f"{name}.argv.json").write_text(json.dumps({"argv": argv, "env": dict(env or {})}))
        log.info("started %s pid=%d", name, proc.pid)

    # -- faults (the reliability campaign) --------------------------------------------------------------
    def stop_component(self, name: str, timeout: float = 15.0) -> None:
        """Stop one process of the cluster (SIGTERM, SIGKILL after `timeout`), as when it crashes or its
        node goes away; its data (etcd's, the PKI) stays, and `start_component` brings it back."""
        pid = self._running().get(name)
        if pid is None:
            raise ClusterError(f"{name} is not running")
        stop_groups([pid], timeout)

    def start_component(self, name: str, timeout: float = 60.0) -> None:
        """Start a stopped process again with the command line it had, and wait until it serves (etcd: its
        client port; kube-apiserver: /readyz)."""
        saved = json.loads((self.pids / f"{name}.argv.json").read_text())
        self._start(name, saved["argv"], saved["env"])
        deadline = time.monotonic() + timeout
        if name == "etcd":
            port = self.state()["ports"]["etcd"]
            self._wait(lambda: port_open(port), deadline, name, "etcd to listen")
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
        write_pki(self.pki, servers=(APISERVER_SERVING, METRICS_ADAPTER_SERVING), clients=IDENTITIES)
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
        for identity in IDENTITIES:
            (kubeconfigs / f"{identity.file}.kubeconfig").write_text(
                kubeconfig_text(server, self.pki, identity)
            )
        self.kubeconfig.write_text((kubeconfigs / "admin.kubeconfig").read_text())
        self.kubeconfig.chmod(0o600)
        kwok_config = self.dir / "kwok-stages.yaml"
        kwok_config.write_text(kwok_stages(DEFAULT_IMAGES))
        audit_policy = self.dir / "audit-policy.yaml"
        audit_policy.write_text(AUDIT_POLICY)

        deadline = time.monotonic() + timeout
        self._start("etcd", etcd_argv(bins, self.dir / "etcd-data", ports["etcd"], ports["etcd_peer"]))
        self._wait(lambda: port_open(ports["etcd"]), deadline, "etcd", "etcd to listen")
        apiserver = apiserver_argv(
            bins,
            etcd_port=ports["etcd"],
            port=ports["apiserver"],
            pki=self.pki,
            cert_dir=self.dir / "apiserver-certs",
            audit_policy=audit_policy,
            audit_log=self.audit_log,
        )
        self._start("kube-apiserver", apiserver)
        self._wait(self._apiserver_ready, deadline, "kube-apiserver", "kube-apiserver /readyz")
        self._start(
            "kube-controller-manager",
            controller_manager_argv(
                bins, kubeconfigs / "kube-controller-manager.kubeconfig", self.pki, pod_cidr
            ),
        )
        self._start("kube-scheduler", scheduler_argv(bins, kubeconfigs / "kube-scheduler.kubeconfig"))
        self._apply_kwok_crds(bins)
        self._start(
            "kwok",
            kwok_argv(bins, kubeconfigs / "kwok.kubeconfig", kwok_config, kwok_fallback_cidr, ports["kwok"]),
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
        for obj in autoscaling_objects(load_autoscaled_pools(self.nodepools_file), ports["metrics_adapter"]):
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
            cluster_autoscaler_argv(bins, ca_kubeconfig, ports["cluster_autoscaler"]),
            env=cluster_autoscaler_env(ca_kubeconfig),
        )
        self._wait(
            lambda: port_open(ports["metrics_adapter"]), deadline, "metrics-adapter", "the adapter to listen"
        )
        ca_bundle = base64.b64encode((pki / "ca.crt").read_bytes()).decode()
        for obj in custom_metrics_apiservices(ports["metrics_adapter"], ca_bundle):
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
        if pid_alive(pid):
            stop_groups([pid], 15.0)

    def down(self, timeout: float = 15.0) -> None:
        """Stop every process of this cluster (process groups), wait for them, remove its state."""
        running = self._running()
        self._stop_client("operator")  # `make demo` leaves the operator running against this cluster
        # The autoscaler first, while the API is up (on exit it deletes the nodes it made), then everything
        # that talks to etcd, then etcd: an apiserver that loses etcd mid-shutdown hangs.
        waves = [list(AUTOSCALING_COMPONENTS), [n for n in COMPONENTS if n != "etcd"], ["etcd"]]
        for wave in waves:
            stop_groups([running[n] for n in wave if n in running], timeout)
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
    except (ClusterError, NodePoolError, subprocess.CalledProcessError, urllib.error.URLError) as err:
        print(f"localcluster {args.command}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
