"""The pod runner: watches pods bound to the local cluster's simulated nodes and runs the runnable ones
(`selection.is_runnable`) as local processes, one `PodWorker` thread per pod. Pod IPs come from the top of the
node's podCIDR (kwok hands out the bottom of the same range to the pods it simulates), so every pod binds its
own loopback address and the Service's EndpointSlices lead to the real processes.

Run: `python -m specdeploy_localcluster.podrunner --kubeconfig K --dir D --node-ip IP` (LocalCluster starts
it as `pod-runner`).
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch

from .pod import PodWorker
from .selection import DEFAULT_IMAGES, ImageDefaults, is_runnable

__all__ = ["PodRunner", "main"]

log = logging.getLogger("podrunner")


class PodRunner:
    def __init__(
        self,
        api: client.ApiClient,
        root: Path,
        node_ip: str,
        images: Mapping[str, ImageDefaults] = DEFAULT_IMAGES,
        venv_bin: Path | None = None,
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.root = root
        self.node_ip = node_ip
        self.images = images
        self.venv_bin = venv_bin or Path(sys.executable).parent
        self.workers: dict[str, PodWorker] = {}
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def _allocate_ip(self, node_name: str) -> str | None:
        """A free address from the top of the node's podCIDR, or None while the node has none yet."""
        node = self.core.read_node(node_name)
        if not node.spec.pod_cidr:
            return None
        network = ipaddress.ip_network(node.spec.pod_cidr)
        pods = self.core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node_name}").items
        used = {p.status.pod_ip for p in pods if p.status and p.status.pod_ip}
        used |= {w.pod_ip for w in self.workers.values()}
        for address in reversed(list(network.hosts())):
            if str(address) not in used:
                return str(address)
        raise RuntimeError(f"no free pod IP left in {network} of node {node_name}")

    def handle(self, event_type: str, pod: dict[str, Any]) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        uid = meta["uid"]
        with self.lock:
            worker = self.workers.get(uid)
            if event_type == "DELETED":
                if worker is not None:
                    worker.vanish()
                return
            if worker is not None:
                if meta.get("deletionTimestamp"):
                    worker.delete(float(meta.get("deletionGracePeriodSeconds") or 0))
                return
            node = spec.get("nodeName")
            phase = (pod.get("status") or {}).get("phase")
            if not node or phase in ("Succeeded", "Failed") or not is_runnable(pod, self.images):
                return
            if meta.get("deletionTimestamp"):  # never started here (a runner restart): let it go
                self.core.delete_namespaced_pod(meta["name"], meta["namespace"], grace_period_seconds=0)
                return
            # A pod this runner ran before it restarted keeps its IP (EndpointSlices already point there).
            pod_ip = (pod.get("status") or {}).get("podIP") or self._allocate_ip(node)
            if pod_ip is None:
                return  # the node IPAM has not given the node a podCIDR yet; the next event retries
            worker = PodWorker(
                self.api,
                pod,
                pod_dir=self.root / f"{meta['namespace']}_{meta['name']}_{uid[:8]}",
                pod_ip=pod_ip,
                node_ip=self.node_ip,
                images=self.images,
                venv_bin=self.venv_bin,
                on_exit=self._forget,
            )
            self.workers[uid] = worker
        log.info("running pod %s/%s on %s at %s", meta["namespace"], meta["name"], node, pod_ip)
        worker.thread.start()

    def _forget(self, uid: str) -> None:
        with self.lock:
            self.workers.pop(uid, None)

    def watch_pods(self) -> None:
        while not self.stopping.is_set():
            try:
                listing = self.core.list_pod_for_all_namespaces()
                for item in listing.items:
                    self.handle("ADDED", self.api.sanitize_for_serialization(item))
                stream = watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces,
                    resource_version=listing.metadata.resource_version,
                    timeout_seconds=60,
                )
                for event in stream:
                    if self.stopping.is_set():
                        return
                    self.handle(event["type"], self.api.sanitize_for_serialization(event["object"]))
            except Exception:  # keep running pods whatever one event did (logged with its trace)
                if self.stopping.is_set():
                    return
                log.exception("pod watch failed; listing again in 1 s")
                time.sleep(1)

    def stop(self) -> None:
        """The runner is stopping (the cluster goes down): end every process, leave the pods as they are."""
        self.stopping.set()
        with self.lock:
            workers = list(self.workers.values())
        for worker in workers:
            worker.vanish()
        for worker in workers:
            worker.thread.join(timeout=10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="podrunner", description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--dir", required=True, type=Path, help="the pods' directories (volumes, logs)")
    parser.add_argument("--node-ip", required=True, help="the simulated nodes' InternalIP (hostIP of pods)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    runner = PodRunner(config.new_client_from_config(config_file=args.kubeconfig), args.dir, args.node_ip)
    done = threading.Event()

    def stop() -> None:
        runner.stop()
        done.set()

    def on_term(*_: Any) -> None:
        threading.Thread(target=stop, daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    threading.Thread(target=runner.watch_pods, name="pod-watch", daemon=True).start()
    log.info("pod runner: images %s, programs from %s", sorted(runner.images), runner.venv_bin)
    done.wait()
    return 0
