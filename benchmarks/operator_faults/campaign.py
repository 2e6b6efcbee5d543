"""The campaign's shared parts: a local cluster with kubectl and reads (the operator benchmark's `Bench`),
scratch namespaces, operator processes, waiting, and the checks every scenario ends with (one build Job per
engine, no orphaned child, each deployment Ready with its status current)."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import yaml
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.operatorproc import OperatorProcess

from benchmarks.operator.cluster import Bench

from . import REPO

GROUP_PATH = "/apis/specdeploy.dev/v1alpha1"
PREFIX = "chaos"
OPERATOR_ENV = {
    "SPECDEPLOY_GC_GRACE_SECONDS": "3",
    "SPECDEPLOY_BUILD_BACKOFF_LIMIT": "1",
    "SPECDEPLOY_RESYNC_SECONDS": "60",
    "SPECDEPLOY_WATCH_NAMESPACES": f"{PREFIX}-*",
}
PEERING_CRDS = REPO / "charts" / "specdeploy" / "charts" / "kopf-peering" / "crds" / "kopf.dev_peerings.yaml"
MANAGED = "app.kubernetes.io/managed-by=specdeploy"
OWNED_KINDS = {
    "jobs": "/apis/batch/v1",
    "deployments": "/apis/apps/v1",
    "services": "/api/v1",
    "configmaps": "/api/v1",
    "poddisruptionbudgets": "/apis/policy/v1",
    "horizontalpodautoscalers": "/apis/autoscaling/v2",
}
# Kill points (failpoints.py names), the deployment each needs, and what reaching it means.
KILL_POINTS: tuple[tuple[str, str], ...] = (
    ("before:PATCH enginebuilds", "build"),
    ("after:PATCH enginebuilds", "build"),
    ("before:PATCH persistentvolumeclaims", "build"),
    ("before:PATCH jobs", "build"),
    ("after:PATCH jobs", "build"),
    ("after:PATCH enginebuilds/status", "build"),
    ("before:PATCH configmaps", "build"),
    ("after:PATCH deployments", "build"),
    ("before:PATCH services", "build"),
    ("before:PATCH poddisruptionbudgets", "build"),
    ("before:PATCH speculativedeployments/status", "build"),
    ("before:POST events", "build"),
    ("before:PATCH horizontalpodautoscalers", "autoscaled"),
    ("before:DELETE enginebuilds", "gc"),
)
FAST_KILL_POINTS = (
    "after:PATCH jobs",
    "before:PATCH speculativedeployments/status",
    "before:DELETE enginebuilds",
)


@dataclass
class Outcome:
    """One scenario's row: what was injected, what was checked, the result and its figures."""

    scenario: str
    injected: str
    checked: str
    passed: bool = True
    problems: list[str] = field(default_factory=list)
    figures: dict[str, float] = field(default_factory=dict)

    def expect(self, ok: bool, problem: str) -> None:
        if not ok:
            self.passed = False
            self.problems.append(problem)


class Campaign(Bench):
    """A local cluster and the helpers the scenarios share: the operator benchmark's kubectl and reads, plus
    namespaces, operators, waiting and the convergence checks."""

    def __init__(self, cluster: LocalCluster) -> None:
        super().__init__(cluster)
        self.counter = 0

    @contextmanager
    def trial(self, outcome: Outcome, *operators: OperatorProcess) -> Iterator[None]:
        """One scenario's run: `operators` started here and stopped after, whatever happens; a wait that
        timed out becomes the outcome's problem instead of ending the campaign."""
        started: list[OperatorProcess] = []
        try:
            for op in operators:
                op.start()
                started.append(op)
            yield
        except TimeoutError as error:
            outcome.expect(False, str(error))
        finally:
            for op in started:
                op.stop()

    @contextmanager
    def scratch_namespace(self) -> Iterator[str]:
        self.counter += 1
        name = f"{PREFIX}-{int(time.time()) % 100000}-{self.counter}"
        self.kubectl("create", "namespace", name)
        try:
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")

    def operator(
        self, env: dict[str, str] | None = None, args: tuple[str, ...] = (), log: str = "op"
    ) -> OperatorProcess:
        return OperatorProcess(
            self.cluster.operator_kubeconfig,
            self.cluster.logs,
            env={**OPERATOR_ENV, **(env or {})},
            args=args,
            log_name=f"chaos-{log}.log",
        )

    def apply(self, doc: dict[str, Any]) -> None:
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(doc))

    def sdep(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            got: dict[str, Any] = self.cluster.api(
                "GET", f"{GROUP_PATH}/namespaces/{namespace}/speculativedeployments/{name}"
            )
        except OSError:
            return None
        return got

    def ready(self, namespace: str, name: str, replicas: int | None = None) -> bool:
        obj = self.sdep(namespace, name) or {}
        status = obj.get("status") or {}
        generation = (obj.get("metadata") or {}).get("generation")
        want = (
            replicas
            if replicas is not None
            else (obj.get("spec") or {}).get("replicas", status.get("replicas"))
        )
        return bool(
            status.get("phase") == "Ready"
            and status.get("observedGeneration") == generation
            and status.get("readyReplicas") == want
        )

    def wait(self, check: Callable[[], Any], timeout: float, what: str) -> float:
        """Seconds until `check()` holds; raises TimeoutError after `timeout`."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if check():
                return time.monotonic() - start
            time.sleep(0.25)
        raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")

    def wait_quiet(self, read: Callable[[], Any], quiet: float, timeout: float, what: str) -> Any:
        """`read()`'s value once it has not changed for `quiet` seconds; raises TimeoutError if it still
        changes after `timeout`."""
        start = time.monotonic()
        last, since = read(), time.monotonic()
        while time.monotonic() - since < quiet:
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"{what} still changing after {timeout:.0f} s (last: {last!r})")
            time.sleep(0.25)
            value = read()
            if value != last:
                last, since = value, time.monotonic()
        return last

    def converged(self, outcome: Outcome, namespace: str, names: list[str]) -> None:
        """Checks every scenario ends with: one Job per EngineBuild, no orphan, each deployment's status."""
        engines = {
            e["metadata"]["name"] for e in self.items(f"{GROUP_PATH}/namespaces/{namespace}/enginebuilds")
        }
        jobs = self.items(f"/apis/batch/v1/namespaces/{namespace}/jobs?labelSelector={MANAGED}")
        per_engine: dict[str, int] = {}
        for job in jobs:
            for ref in job["metadata"].get("ownerReferences") or ():
                if ref["kind"] == "EngineBuild":
                    per_engine[ref["name"]] = per_engine.get(ref["name"], 0) + 1
        duplicates = {k: v for k, v in per_engine.items() if v > 1}
        outcome.expect(not duplicates, f"duplicate build Jobs: {duplicates}")
        outcome.figures["duplicate_jobs"] = float(sum(v - 1 for v in per_engine.values()))
        sdeps = {
            d["metadata"]["name"]
            for d in self.items(f"{GROUP_PATH}/namespaces/{namespace}/speculativedeployments")
        }
        orphans = []
        for plural, prefix in OWNED_KINDS.items():
            for obj in self.items(f"{prefix}/namespaces/{namespace}/{plural}?labelSelector={MANAGED}"):
                owners = obj["metadata"].get("ownerReferences") or []
                alive = any(
                    (o["kind"] == "SpeculativeDeployment" and o["name"] in sdeps)
                    or (o["kind"] == "EngineBuild" and o["name"] in engines)
                    for o in owners
                )
                if not alive and not obj["metadata"].get("deletionTimestamp"):
                    orphans.append(f"{plural}/{obj['metadata']['name']}")
        outcome.expect(not orphans, f"orphaned children: {orphans}")
        outcome.figures["orphans"] = float(len(orphans))
        for name in names:
            outcome.expect(self.ready(namespace, name), f"{name} not Ready with its status current")


def example(prefix: str) -> dict[str, Any]:
    """An engine-path example (examples/tensorrt/): there the max draft length is part of the engine."""
    path = next(
        p for p in sorted((REPO / "examples" / "tensorrt").glob("*.yaml")) if p.name.startswith(prefix)
    )
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def deployment(kind: str, namespace: str, name: str, variant: int) -> dict[str, Any]:
    """A deployment with engines of its own (the max draft length is part of the engine hash)."""
    doc = copy.deepcopy(example("08" if kind == "autoscaled" else "01"))
    doc["metadata"] = {"name": name, "namespace": namespace}
    doc["spec"]["speculative"]["maxDraftLen"] = 4 + variant
    if kind != "autoscaled":
        doc["spec"]["replicas"] = 2  # a PodDisruptionBudget too
    return doc


def reconcile_errors(op: OperatorProcess) -> float:
    """Failed reconciles so far (`specdeploy_operator_reconciles_total{result="error"}`)."""
    samples = op.metrics()
    return sum(
        v
        for k, v in samples.items()
        if k.startswith("specdeploy_operator_reconciles_total") and 'result="error"' in k
    )


def api_requests(op: OperatorProcess, *, writes_only: bool = False, status: str | None = None) -> float:
    """Requests the operator made so far (`specdeploy_operator_api_requests_total`): all of them, only writes
    (PATCH, POST, PUT, DELETE), or those the API server answered with `status`."""
    total = 0.0
    for key, value in op.metrics().items():
        if not key.startswith("specdeploy_operator_api_requests_total"):
            continue
        if writes_only and 'verb="GET"' in key:
            continue
        if status is not None and f'code="{status}"' not in key:
            continue
        total += value
    return total


def status_writes(op: OperatorProcess) -> float:
    """Status writes so far (`specdeploy_operator_status_writes_total`, every kind)."""
    return sum(v for k, v in op.metrics().items() if k.startswith("specdeploy_operator_status_writes_total"))
