"""The benchmark's cluster: started with the extra node pools and the CRDs, objects applied with kubectl, and
the polls that time a rollout until every object is ready."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.nodepools import NodePool

from benchmarks.operator import REPO

__all__ = [
    "GROUP_PATH",
    "Bench",
    "Rollout",
    "deployment_ready",
    "inventory",
    "sdep_describe",
    "sdep_ready",
    "start_cluster",
    "wait",
    "watch_ready",
]

GROUP_PATH = "/apis/specdeploy.dev/v1alpha1"


class Bench:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.kubectl_bin = str(cluster.bin_dir / "kubectl")

    def kubectl(self, *args: str, input: str | None = None) -> str:
        proc = subprocess.run(
            [self.kubectl_bin, f"--kubeconfig={self.cluster.kubeconfig}", *args],
            input=input,
            capture_output=True,
            text=True,
            timeout=1800,  # one apply of a few thousand objects at 1 000 deployments
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"kubectl {' '.join(args[:3])} failed: {proc.stderr.strip()[-2000:]}")
        return proc.stdout

    def apply_list(self, items: list[dict[str, Any]]) -> None:
        doc = {"apiVersion": "v1", "kind": "List", "items": items}
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(doc))

    def namespace(self, name: str) -> None:
        self.cluster.api("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        wait(
            lambda: self.exists(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
            60,
            f"default ServiceAccount in {name}",
        )

    def exists(self, path: str) -> bool:
        try:
            self.cluster.api("GET", path)
        except OSError:
            return False
        return True

    def items(self, path: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.cluster.api("GET", path, timeout=30)["items"]
        return items


def wait(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if result:
            return result
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


@dataclass
class Rollout:
    """Time from the start of `kubectl apply` until every object was seen ready (or the timeout)."""

    seconds: float
    apply_seconds: float
    per_object: list[float]
    not_ready: dict[str, str] = field(default_factory=dict)  # name -> what it showed last


def watch_ready(
    bench: Bench,
    path: str,
    *,
    names: set[str],
    ready: Callable[[dict[str, Any]], bool],
    describe: Callable[[dict[str, Any]], str],
    started: float,
    apply_seconds: float,
    timeout: float,
    interval: float = 0.5,
) -> Rollout:
    seen: dict[str, float] = {}
    last: dict[str, str] = {}
    deadline = started + timeout
    while len(seen) < len(names) and time.monotonic() < deadline:
        now = time.monotonic()
        for obj in bench.items(path):
            name = obj["metadata"]["name"]
            if name in names and name not in seen:
                if ready(obj):
                    seen[name] = now - started
                else:
                    last[name] = describe(obj)
        if len(seen) < len(names):
            time.sleep(interval)
    total = max(seen.values()) if len(seen) == len(names) else time.monotonic() - started
    missing = {n: last.get(n, "not seen") for n in sorted(names - set(seen))}
    return Rollout(total, apply_seconds, sorted(seen.values()), missing)


def deployment_ready(obj: dict[str, Any]) -> bool:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    want = spec.get("replicas", 1)
    return bool(
        status.get("observedGeneration", 0) >= obj["metadata"].get("generation", 0)
        and status.get("readyReplicas", 0) == want
        and status.get("updatedReplicas", 0) == want
    )


def group_set_ready(obj: dict[str, Any]) -> bool:
    """A LeaderWorkerSet with every group ready and updated (its status names no generation)."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    want = spec.get("replicas", 1)
    return bool(status.get("readyReplicas", 0) == want and status.get("updatedReplicas", 0) == want)


def sdep_ready(obj: dict[str, Any]) -> bool:
    status = obj.get("status") or {}
    return bool(
        status.get("phase") == "Ready" and status.get("observedGeneration") == obj["metadata"]["generation"]
    )


def sdep_describe(obj: dict[str, Any]) -> str:
    status = obj.get("status") or {}
    false = [
        f"{c['type']}={c['status']} {c.get('reason', '')}: {c.get('message', '')}"
        for c in status.get("conditions") or ()
        if c.get("status") != "True"
    ]
    return f"phase={status.get('phase')} " + "; ".join(false)


def start_cluster(cluster: LocalCluster, pools: list[NodePool]) -> Bench:
    """The cluster up with the extra node pools and the CRDs installed."""
    cluster.up(timeout=180)
    cluster.apply_nodepools(pools)
    cluster.wait_nodes_ready(timeout=120)
    bench = Bench(cluster)
    bench.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    bench.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
    return bench


def inventory(bench: Bench, ns: str) -> tuple[list[dict[str, Any]], int, int]:
    """EngineBuilds, the number of Jobs and the number of build pods in `ns`."""
    engines = bench.items(f"{GROUP_PATH}/namespaces/{ns}/enginebuilds")
    jobs = bench.items(f"/apis/batch/v1/namespaces/{ns}/jobs")
    pods = bench.items(f"/api/v1/namespaces/{ns}/pods")
    return engines, len(jobs), sum(1 for p in pods if "job-name" in (p["metadata"].get("labels") or {}))
