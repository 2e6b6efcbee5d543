"""Autoscaling, the whole chain with real load: how long from load to a new replica serving, and from no load
to the node gone; writes its record, benchmarks/results/autoscaling.json, and the autoscaling block of
docs/benchmarks.md rendered from it (benchmarks/autoscaling_report.py, benchmarks/records.py).

python -m benchmarks.autoscaling              # 3 rounds per path (~15 min with the cluster start)
python -m benchmarks.autoscaling --rounds 1 --no-write     # a smoke run: no record, docs untouched

One run on its own local cluster (a temporary directory) with Prometheus, prometheus-adapter (configured from
the chart) and the Cluster Autoscaler (kwok provider). The deployment is the CPU example (`backend:
transformers`, the real server in real pods, models made in the cluster by the demo's Job) on the
`cpu-autoscaled` pool, whose 1-CPU nodes hold one replica each, autoscaled 1..2 on `queueDepth` with target 2.
Nothing writes a metric value. Each round:

1. load up: 8 clients stream completions through the Service; timed from the load's start until the pods'
   queue depth, as the custom metrics API serves it (servers -> Prometheus -> adapter), is above the target
   (*metric*), until the HPA raised the replica count (*HPA reaction*), until the new node exists (*node
   provisioning*, simulated: kwok makes it Ready at once), until the new replica is Ready (*pod start*: the
   real server loads its models) and until a request completed through it (*serving*);
2. load stops: timed until the replica count is back to one (*scale-down*, bounded below by the 10 s
   stabilization window) and until the Cluster Autoscaler deleted the emptied node (*node removal*, bounded
   below by its 10 s unneeded time).

Two paths, alternating round by round: the *reference* is a plain Deployment of the same pods (its ConfigMap
and Service too) with a HorizontalPodAutoscaler on it (what the cluster itself costs); the *operator* path is
the SpeculativeDeployment with `spec.autoscaling`, whose HPA scales it through its scale subresource, the
operator then scaling its Deployment and reporting CapacityPending / Ready. The ratio operator / reference is
what the operator adds.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.demomodels import make_demo_models
from specdeploy_localcluster.nodepools import POOL_LABEL
from specdeploy_localcluster.operatorproc import OperatorProcess
from specdeploy_localcluster.serviceload import ServiceEndpoints, StreamingLoad
from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.builders import (
    OperatorSettings,
    build_configmap,
    build_deployment,
    build_hpa,
    build_service,
)

from benchmarks import records
from benchmarks.autoscaling_report import render
from benchmarks.operator.cluster import GROUP_PATH, Bench, start_cluster, wait

REPO = Path(__file__).resolve().parents[1]

METRIC = "specdeploy_queue_depth"
TARGET = 2
CLIENTS = 8
POOL = "cpu-autoscaled"
TRAINING_STEPS = 60
NS_REF, NS_OP = "scale-reference", "scale-operator"
OPERATOR_ENV = {"SPECDEPLOY_RESYNC_SECONDS": "60"}
SETTLE_SECONDS = 32


def deployment_doc(namespace: str) -> dict[str, Any]:
    """examples/09 (the CPU example) on the `cpu-autoscaled` pool, one replica per node, autoscaled 1..2 on
    `queueDepth` with a 10 s scale-down window."""
    doc: dict[str, Any] = yaml.safe_load((REPO / "examples" / "09-transformers-cpu-tiny.yaml").read_text())
    doc["metadata"] = {"name": "tiny-cpu", "namespace": namespace}
    doc["spec"].pop("replicas", None)
    doc["spec"]["placement"] = {"device": "cpu", "nodeSelector": {POOL_LABEL: POOL}}
    doc["spec"]["serving"]["resources"] = {
        "requests": {"cpu": "600m", "memory": "512Mi"},
        "limits": {"cpu": "1", "memory": "1536Mi"},
    }
    doc["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 2,
        "metric": "queueDepth",
        "target": TARGET,
        "scaleUp": {"stabilizationWindowSeconds": 0, "periodSeconds": 5},
        "scaleDown": {"stabilizationWindowSeconds": 10, "maxPods": 1, "periodSeconds": 15},
    }
    return doc


def reference_objects(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The same pods as a plain Deployment (no owner, with its ConfigMap and Service) with an HPA of the same
    metric and behaviour on it."""
    sdep = SpeculativeDeployment.model_validate(doc)
    settings = OperatorSettings()
    configmap = build_configmap(sdep, [], settings)
    objects = [configmap, build_service(sdep), build_deployment(sdep, [], settings, configmap=configmap)]
    hpa = build_hpa(sdep)
    hpa["spec"]["scaleTargetRef"] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": sdep.metadata.name,
    }
    objects.append(hpa)
    for obj in objects:
        obj["metadata"].pop("ownerReferences", None)
    return objects


@dataclass
class Round:
    path: str
    seconds: dict[str, float]  # phase -> seconds since the load changed


class Target:
    """What a path scales: its replica count, its serving pods, their queue depth as the HPA sees it."""

    def __init__(self, bench: Bench, api: k8s.ApiClient, path: str, namespace: str, name: str) -> None:
        self.bench, self.path, self.namespace, self.name = bench, path, namespace, name
        self.selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=server"
        self.endpoints = ServiceEndpoints(api, namespace, name)

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

    def pods(self) -> list[dict[str, Any]]:
        path = f"/api/v1/namespaces/{self.namespace}/pods?labelSelector={self.selector}"
        return [p for p in self.bench.items(path) if not p["metadata"].get("deletionTimestamp")]

    def metric(self) -> float | None:
        """Mean `METRIC` over the pods, from the custom metrics API (what the HPA controller reads)."""
        path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{self.namespace}/pods/*/{METRIC}"
        try:
            items = self.bench.cluster.api("GET", f"{path}?labelSelector={self.selector}")["items"]
        except OSError:
            return None
        values = [_quantity(i["value"]) for i in items]
        return sum(values) / len(values) if values else None


def _quantity(value: str) -> float:
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def autoscaled_nodes(cluster: LocalCluster) -> set[str]:
    return {n["metadata"]["name"] for n in cluster.autoscaled_nodes(POOL)}


def one_round(target: Target, timeout: float) -> Round:
    seconds: dict[str, float] = {}
    [first] = [p["metadata"]["name"] for p in target.pods()]
    before = autoscaled_nodes(target.bench.cluster)
    load = StreamingLoad(target.endpoints, clients=CLIENTS, max_tokens=48).start()
    start = time.monotonic()
    new_url = None
    try:
        while "serving" not in seconds:
            now = time.monotonic() - start
            if now > timeout:
                raise TimeoutError(f"{target.path}: scale-up incomplete after {timeout}s: {seconds}")
            if "metric" not in seconds and (target.metric() or 0) > TARGET:
                seconds["metric"] = now
            if "hpa" not in seconds and target.replicas() == 2:
                seconds["hpa"] = now
            if "node" not in seconds and autoscaled_nodes(target.bench.cluster) - before:
                seconds["node"] = now
            if "hpa" in seconds and "pod" not in seconds and target.ready(2):
                seconds["pod"] = now
                [new] = [p for p in target.pods() if p["metadata"]["name"] != first]
                new_url = f"http://{new['status']['podIP']}:8000"
            if new_url is not None and new_url in load.report.endpoints:
                seconds["serving"] = now
            time.sleep(0.1)
    finally:
        report = load.stop()
    if report.failed or report.truncated:
        raise RuntimeError(
            f"{target.path}: requests failed under load: {report.failed[:3]} {report.truncated[:3]}"
        )
    seconds["up"] = seconds["serving"] - seconds["metric"]
    added = autoscaled_nodes(target.bench.cluster) - before
    start = time.monotonic()
    while "node_gone" not in seconds:
        now = time.monotonic() - start
        if now > timeout:
            raise TimeoutError(f"{target.path}: scale-down incomplete after {timeout}s: {seconds}")
        if "down" not in seconds and target.replicas() == 1 and len(target.pods()) == 1:
            seconds["down"] = now
        if "down" in seconds and not (added & autoscaled_nodes(target.bench.cluster)):
            seconds["node_gone"] = now
        time.sleep(0.2)
    wait(lambda: target.ready(1), 60, f"{target.path} back to one Ready replica")
    check_autoscaler_timers(target.path, seconds)
    return Round(target.path, seconds)


NODE_BOUND_SECONDS, NODE_GONE_BOUND_SECONDS = 30.0, 60.0
"""The local cluster's Cluster Autoscaler adds a node for a pending pod within 30 s of the HPA's decision
(it does not wait for the pod to age: `--bypassed-scheduler-names`) and takes an emptied one away within 60 s
(`--scale-down-unneeded-time=10s`); timings of the harness, so checked here rather than in the tests."""


def check_autoscaler_timers(path: str, seconds: dict[str, float]) -> None:
    added, removed = seconds["node"] - seconds["hpa"], seconds["node_gone"] - seconds["down"]
    if added > NODE_BOUND_SECONDS or removed > NODE_GONE_BOUND_SECONDS:
        raise RuntimeError(
            f"{path}: the Cluster Autoscaler added a node {added:.0f} s after the HPA scaled (at most "
            f"{NODE_BOUND_SECONDS:.0f}) and removed it {removed:.0f} s after the scale-down (at most "
            f"{NODE_GONE_BOUND_SECONDS:.0f}): see the test timers in autoscalingstack.cluster_autoscaler_argv"
        )


def _kubectl(bench: Bench) -> Any:
    """`demomodels.Kubectl` over the bench's kubectl."""

    def run(*args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess(list(args), 0, bench.kubectl(*args, input=input), "")

    return run


def run(rounds: int, timeout: float, keep: bool) -> list[Round]:
    state = Path(tempfile.mkdtemp(prefix="specdeploy-bench-scale-"))
    cluster = LocalCluster(state, autoscaling=True)
    operator: OperatorProcess | None = None
    try:
        print(f"cluster in {state} ...", flush=True)
        bench = start_cluster(cluster, [])
        for ns in (NS_REF, NS_OP):
            bench.namespace(ns)
            make_demo_models(_kubectl(bench), ns, TRAINING_STEPS)
        operator = OperatorProcess(cluster.operator_kubeconfig, cluster.logs, env=OPERATOR_ENV)
        operator.start()
        name = deployment_doc(NS_OP)["metadata"]["name"]
        api = k8s_config.new_client_from_config(str(cluster.kubeconfig))
        targets = [
            Target(bench, api, path, ns, name) for path, ns in (("reference", NS_REF), ("operator", NS_OP))
        ]
        # The two paths take turns on the cpu-autoscaled pool: the other path is parked at zero replicas
        # without an autoscaler while one is measured.
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
                result = one_round(target, timeout)
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
        if bench.exists(f"/apis/apps/v1/namespaces/{target.namespace}/deployments/{target.name}"):
            bench.kubectl("scale", "deployment", target.name, "-n", target.namespace, "--replicas=0")
    elif bench.exists(f"{GROUP_PATH}/namespaces/{target.namespace}/speculativedeployments/{target.name}"):
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
        objects = reference_objects(deployment_doc(NS_REF))
        objects[2]["spec"]["replicas"] = 1
        bench.apply_list(objects)
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
