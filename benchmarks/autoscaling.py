"""Autoscaling on the simulated GPU cluster: how long from load to a new Ready replica, and from no load to
the GPU node gone; writes its record, benchmarks/results/autoscaling.json, and the autoscaling block of
docs/benchmarks.md rendered from it (benchmarks/autoscaling_report.py, benchmarks/records.py).

python -m benchmarks.autoscaling              # 3 rounds per path (~8 min with the cluster start)
python -m benchmarks.autoscaling --rounds 1 --no-write     # a smoke run: no record, docs untouched

One run on its own local cluster (a temporary directory) with the custom metrics test adapter and the Cluster
Autoscaler (kwok provider). Every replica takes a whole 8-GPU H200 node: the one static H200 node holds the
first, the second needs a node from the autoscaled H200 pool. Each round:

1. load up: the per-pod metric is written at 3x the target on every serving pod (as the servers' `/metrics`
   would report it through a metrics pipeline); timed until the autoscaler raised the replica count (*HPA
   reaction*), until the new node exists (*node provisioning*, simulated: kwok makes it Ready at once), and
   until the new replica is Ready (*pod start*);
2. load down: the metric falls to a tenth of the target; timed until the replica count is back to one
   (*scale-down*, bounded below by the 10 s stabilization window) and until the Cluster Autoscaler deleted the
   emptied node (*node removal*, bounded below by its 10 s unneeded time).

Two paths, alternating round by round: the *reference* is a plain Deployment of the same pods with a
HorizontalPodAutoscaler on it (what the cluster itself costs); the *operator* path is a SpeculativeDeployment
with `spec.autoscaling`, whose HPA scales it through its scale subresource, the operator then scaling its
Deployment and reporting CapacityPending / Ready. The ratio operator / reference is what the operator adds.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack" / "cluster"))

from localcluster import LocalCluster  # noqa: E402
from operatorproc import OperatorProcess  # noqa: E402
from specdeploy_operator.api import SpeculativeDeployment  # noqa: E402
from specdeploy_operator.builders import (  # noqa: E402
    OperatorSettings,
    build_deployment,
    build_engine_builds,
    build_hpa,
)

from benchmarks import records  # noqa: E402
from benchmarks.autoscaling_report import render  # noqa: E402
from benchmarks.operator.cluster import GROUP_PATH, Bench, start_cluster, wait  # noqa: E402

METRIC = "specdeploy_queue_seconds"
TARGET = 10
H200 = "NVIDIA-H200"
NS_REF, NS_OP = "scale-reference", "scale-operator"
OPERATOR_ENV = {"SPECDEPLOY_RESYNC_SECONDS": "60"}
SETTLE_SECONDS = 32


def deployment_doc(namespace: str) -> dict[str, Any]:
    """examples/04b at tensor parallel 8 with the draft colocated (8 GPUs a replica), autoscaled 1..2 on
    `queueSeconds` with a 10 s scale-down window."""
    doc: dict[str, Any] = yaml.safe_load(
        (REPO / "examples" / "04b-draft-target-llama70b-1b-h200.yaml").read_text()
    )
    doc["metadata"] = {"name": "llama-70b-autoscaled", "namespace": namespace}
    doc["spec"]["target"]["tensorParallel"] = 8
    doc["spec"]["placement"]["draft"] = "colocated"
    doc["spec"].pop("replicas", None)
    doc["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 2,
        "metric": "queueSeconds",
        "target": TARGET,
        "scaleDown": {"stabilizationWindowSeconds": 10, "maxPods": 1, "periodSeconds": 15},
    }
    return doc


def reference_objects(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The same pods as a plain Deployment (no owner) with an HPA of the same metric and behaviour on it."""
    sdep = SpeculativeDeployment.model_validate(doc)
    deployment = build_deployment(sdep, build_engine_builds(sdep, OperatorSettings()))
    deployment["metadata"].pop("ownerReferences", None)
    deployment["spec"]["template"]["spec"].pop("initContainers", None)
    deployment["spec"]["template"]["spec"]["volumes"] = []
    deployment["spec"]["template"]["spec"]["containers"][0]["volumeMounts"] = []
    hpa = build_hpa(sdep)
    hpa["metadata"].pop("ownerReferences", None)
    hpa["spec"]["scaleTargetRef"] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": sdep.metadata.name,
    }
    return [deployment, hpa]


@dataclass
class Round:
    path: str
    seconds: dict[str, float]  # phase -> seconds since the load changed


class Target:
    """What a path scales: its replica count, its serving pods, whether the new replica is Ready."""

    def __init__(self, bench: Bench, path: str, namespace: str, name: str) -> None:
        self.bench, self.path, self.namespace, self.name = bench, path, namespace, name
        self.selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=server"

    def _obj(self) -> dict[str, Any]:
        if self.path == "operator":
            url = f"{GROUP_PATH}/namespaces/{self.namespace}/speculativedeployments/{self.name}"
        else:
            url = f"/apis/apps/v1/namespaces/{self.namespace}/deployments/{self.name}"
        obj: dict[str, Any] = self.bench.cluster.api("GET", url)
        return obj

    def replicas(self) -> int:
        return int(self._obj()["spec"]["replicas"])

    def ready(self, count: int) -> bool:
        obj = self._obj()
        status = obj.get("status") or {}
        if self.path == "operator":
            return status.get("phase") == "Ready" and status.get("readyReplicas") == count
        return status.get("readyReplicas") == count and obj["spec"]["replicas"] == count

    def pods(self) -> list[str]:
        path = f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={self.selector}"
        return [p["metadata"]["name"] for p in self.bench.items(path)]


@contextmanager
def load(cluster: LocalCluster, target: Target, value: Callable[[], str]) -> Iterator[None]:
    """Write `value()` as every serving pod's metric, every 0.5 s, until the block ends."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            for pod in target.pods():
                cluster.set_pod_metric(target.namespace, pod, METRIC, value())
            stop.wait(0.5)

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def autoscaled_nodes(cluster: LocalCluster) -> set[str]:
    return {n["metadata"]["name"] for n in cluster.autoscaled_nodes()}


def one_round(cluster: LocalCluster, target: Target, timeout: float) -> Round:
    seconds: dict[str, float] = {}
    before = autoscaled_nodes(cluster)
    value = {"now": str(TARGET * 3)}
    with load(cluster, target, lambda: value["now"]):
        start = time.monotonic()
        added: set[str] = set()
        while len(seconds) < 3:
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{target.path}: scale-up incomplete after {timeout}s: {seconds}")
            now = time.monotonic() - start
            if "hpa" not in seconds and target.replicas() == 2:
                seconds["hpa"] = now
            if "node" not in seconds:
                added = autoscaled_nodes(cluster) - before
                if added:
                    seconds["node"] = now
            if "hpa" in seconds and "pod" not in seconds and target.ready(2):
                seconds["pod"] = now
            time.sleep(0.1)
        seconds["up"] = seconds["pod"]
        value["now"] = str(TARGET / 10)
        start = time.monotonic()
        while "node_gone" not in seconds:
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{target.path}: scale-down incomplete after {timeout}s: {seconds}")
            now = time.monotonic() - start
            if "down" not in seconds and target.replicas() == 1 and len(target.pods()) == 1:
                seconds["down"] = now
            if "down" in seconds and not (added & autoscaled_nodes(cluster)):
                seconds["node_gone"] = now
            time.sleep(0.2)
    wait(lambda: target.ready(1), 60, f"{target.path} back to one Ready replica")
    return Round(target.path, seconds)


def run(rounds: int, timeout: float, keep: bool) -> list[Round]:
    state = Path(tempfile.mkdtemp(prefix="specdeploy-bench-scale-"))
    cluster = LocalCluster(state)
    operator: OperatorProcess | None = None
    try:
        print(f"cluster in {state} ...", flush=True)
        bench = start_cluster(cluster, [])
        for ns in (NS_REF, NS_OP):
            bench.namespace(ns)
        operator = OperatorProcess(cluster.operator_kubeconfig, cluster.logs, env=OPERATOR_ENV)
        operator.start()
        doc = deployment_doc(NS_OP)
        bench.apply_list(reference_objects(deployment_doc(NS_REF)))
        bench.apply_list([doc])
        name = doc["metadata"]["name"]
        targets = [Target(bench, "reference", NS_REF, name), Target(bench, "operator", NS_OP, name)]
        # The two paths take turns on the one static H200 node, which holds one replica: the other path is
        # parked at zero replicas without an autoscaler while one is measured.
        results: list[Round] = []
        for i in range(rounds):
            for target in targets:
                other = targets[1] if target is targets[0] else targets[0]
                park(bench, other, cluster)
                unpark(bench, target)
                wait(functools.partial(target.ready, 1), timeout, f"{target.path} Ready at one replica")
                # The Deployment controller removes the pod ready for the shortest time (in logarithmic
                # buckets of readiness age): with the first replica ready for 32 s or more the new replica
                # is the one removed on the way down, which empties the new node.
                time.sleep(SETTLE_SECONDS)
                print(f"round {i + 1}: {target.path} ...", flush=True)
                result = one_round(cluster, target, timeout)
                print("  " + ", ".join(f"{k} {v:.1f}s" for k, v in result.seconds.items()), flush=True)
                results.append(result)
        return results
    finally:
        if operator is not None:
            operator.stop()
        cluster.down()
        if keep:
            print(f"kept {state}")
        else:
            shutil.rmtree(state, ignore_errors=True)


def park(bench: Bench, target: Target, cluster: LocalCluster) -> None:
    """Take `target` out of the way: its autoscaler off (min = max = 0 is not allowed, so the HPA is deleted
    for the reference and autoscaling removed for the operator path) and zero replicas."""
    if target.path == "reference":
        bench.kubectl("delete", "hpa", target.name, "-n", target.namespace, "--ignore-not-found")
        bench.kubectl("scale", "deployment", target.name, "-n", target.namespace, "--replicas=0")
    else:
        patch = [{"op": "remove", "path": "/spec/autoscaling"}]
        body = bench.cluster.api(
            "GET", f"{GROUP_PATH}/namespaces/{target.namespace}/speculativedeployments/{target.name}"
        )
        if "autoscaling" in body["spec"]:
            bench.kubectl(
                "patch", "sdep", target.name, "-n", target.namespace, "--type=json", "-p", json.dumps(patch)
            )
        bench.kubectl("scale", "sdep", target.name, "-n", target.namespace, "--replicas=0")
    wait(lambda: not target.pods(), 120, f"{target.path} parked")
    wait(lambda: not autoscaled_nodes(cluster), 180, "no autoscaled node left")


def unpark(bench: Bench, target: Target) -> None:
    if target.path == "reference":
        bench.kubectl("scale", "deployment", target.name, "-n", target.namespace, "--replicas=1")
        bench.apply_list([reference_objects(deployment_doc(NS_REF))[1]])
    else:
        doc = copy.deepcopy(deployment_doc(NS_OP))
        doc["spec"]["replicas"] = 1
        bench.apply_list([doc])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.autoscaling",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per path (default 3)")
    parser.add_argument("--timeout", type=float, default=240, help="seconds allowed per step")
    parser.add_argument("--no-write", action="store_true", help="print only: no record, docs untouched")
    parser.add_argument("--keep", action="store_true", help="keep the cluster directory (logs)")
    args = parser.parse_args(argv)
    started = records.now()
    record = records.new_record(
        "autoscaling",
        records.command_line(["python", "-m", "benchmarks.autoscaling", *argv]),
        started,
        records.machine_facts(),
        {"rounds": args.rounds, "timeout": args.timeout},
    )
    results = run(args.rounds, args.timeout, args.keep)
    records.finish(record, started, {"rounds": [dataclasses.asdict(r) for r in results]})
    print(render([record]))
    if not args.no_write:
        path = records.save(record)
        docs = records.update_docs([record["name"]])
        print(f"wrote {path.relative_to(REPO)} and {', '.join(str(d.relative_to(REPO)) for d in docs)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
