"""The operator's part of the reliability campaign: SIGKILL at named points of its write path, the control
plane stopped under it, a standby replica taking over, a deployment deleted mid-build, names of 63 characters.
Each scenario injects one fault into a real operator process on a real control plane, then checks convergence:
every deployment Ready with the status it should have, exactly one Job per engine, no orphaned child, the
operator process alive where it should be. Writes its record, benchmarks/results/reliability-operator.json,
and the operator table of docs/reliability.md (benchmarks/records.py).

python -m benchmarks.operator_faults              # every scenario on its own local cluster (~10 min)
python -m benchmarks.operator_faults --no-write   # print only

The fast cases run in `make test` (tests/integration/test_operator_faults.py) through the same functions.
"""

from __future__ import annotations

import argparse
import copy
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack" / "cluster"))

from localcluster import LocalCluster  # noqa: E402
from operatorproc import OperatorProcess  # noqa: E402

from benchmarks import records  # noqa: E402
from benchmarks.operator.cluster import Bench  # noqa: E402

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
            self.kubectl("delete", "namespace", name, "--wait=false")

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
    path = next(p for p in sorted((REPO / "examples").glob("*.yaml")) if p.name.startswith(prefix))
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


# -- scenarios ------------------------------------------------------------------------------------------


def kill_at(c: Campaign, point: str, kind: str, variant: int) -> Outcome:
    """SIGKILL the operator when it reaches `point`, start it again, check convergence."""
    outcome = Outcome(
        f"SIGKILL at `{point}`",
        f"operator killed by a failpoint at `{point}`, then restarted",
        "converges: Ready, 1 Job per engine, no orphan, status current",
    )
    # The GC case keeps no engine for rollback, so the old ones are deleted once unused.
    env = {"SPECDEPLOY_KEEP_PREVIOUS_ENGINES": "0"} if kind == "gc" else {}
    with c.scratch_namespace() as ns:
        name = f"kill-{variant}"
        doc = deployment(kind, ns, name, variant)
        if kind == "gc":  # the kill comes when an engine the deployment no longer uses is deleted
            setup = c.operator(env=env, log=f"kill-{variant}")
            setup.start()
            c.apply(doc)
            c.wait(lambda: c.ready(ns, name), 180, f"{name} Ready")
            setup.stop()
            doc["spec"]["speculative"]["maxDraftLen"] = (
                20 + variant
            )  # new engines; the old ones become garbage
        first = c.operator(env={**env, "SPECDEPLOY_FAILPOINT": point}, log=f"kill-{variant}")
        first.start()
        c.apply(doc)
        code = first.wait_exit(120)
        outcome.expect(code == -9, f"the failpoint was not reached (exit {code})")
        if code is None:
            first.kill()
        second = c.operator(env=env, log=f"kill-{variant}")
        second.start()
        try:
            outcome.figures["converge_seconds"] = c.wait(lambda: c.ready(ns, name), 240, f"{name} Ready")
            if kind == "gc":
                c.wait(
                    lambda: len(c.items(f"{GROUP_PATH}/namespaces/{ns}/enginebuilds")) == 2,
                    60,
                    "old engines gone",
                )
            c.converged(outcome, ns, [name])
        except TimeoutError as error:
            outcome.expect(False, str(error))
        finally:
            second.stop()
    return outcome


def control_plane_restart(c: Campaign, component: str, outage: float = 8.0) -> Outcome:
    """Stop kube-apiserver (and compact etcd's history meanwhile, so resumed watches get 410 Gone) or etcd in
    the middle of a build and rollout; start it again; the same operator process must converge."""
    injected = f"{component} stopped {outage:.0f} s mid-rollout" + (
        ", etcd compacted meanwhile (watches resume into 410 Gone)" if component == "kube-apiserver" else ""
    )
    outcome = Outcome(
        f"{component} restart", injected, "operator keeps running (no restart), converges, logs errors"
    )
    with c.scratch_namespace() as ns:
        op = c.operator(log=f"cp-{component}")
        with c.trial(outcome, op):
            name = "cp"
            c.apply(deployment("build", ns, name, 0))
            c.wait(lambda: c.items(f"/apis/batch/v1/namespaces/{ns}/jobs"), 60, "a build Job")
            errors_before = _reconcile_errors(op)
            c.cluster.stop_component(component)
            time.sleep(outage / 2)
            if component == "kube-apiserver":
                outcome.figures["compacted_revision"] = float(c.cluster.compact_etcd())
            time.sleep(outage / 2)
            c.cluster.start_component(component)
            if component == "etcd":  # the apiserver reconnects by itself
                c.wait(c.cluster._apiserver_ready, 60, "the apiserver back")
            outcome.figures["converge_seconds"] = c.wait(lambda: c.ready(ns, name), 240, f"{name} Ready")
            outcome.expect(op.running and op.starts == 1, "the operator process restarted or exited")
            outcome.figures["reconcile_errors"] = _reconcile_errors(op) - errors_before
            c.converged(outcome, ns, [name])
    return outcome


def _reconcile_errors(op: OperatorProcess) -> float:
    samples = op.metrics()
    return sum(
        v
        for k, v in samples.items()
        if k.startswith("specdeploy_operator_reconciles_total") and 'result="error"' in k
    )


def _writes(op: OperatorProcess) -> float:
    samples = op.metrics()
    return sum(v for k, v in samples.items() if k.startswith("specdeploy_operator_api_requests_total"))


def takeover(c: Campaign, lifetime: int = 10) -> Outcome:
    """Two replicas with kopf peering: the standby writes nothing while the active one works; the active one
    is killed mid-change; the standby takes over within the peering lifetime and converges."""
    outcome = Outcome(
        "high availability: active replica killed",
        f"2 replicas (peering, lifetime {lifetime} s); active SIGKILLed after a spec change",
        "standby made 0 writes while standby; takes over and converges; 1 Job per engine",
    )
    c.kubectl("apply", "--server-side", "-f", str(PEERING_CRDS))
    with c.scratch_namespace() as ns:
        c.apply(
            {
                "apiVersion": "kopf.dev/v1",
                "kind": "KopfPeering",
                "metadata": {"name": "specdeploy", "namespace": ns},
            }
        )
        env = {"SPECDEPLOY_WATCH_NAMESPACES": ns, "SPECDEPLOY_PEERING_LIFETIME_SECONDS": str(lifetime)}
        replicas = [c.operator(env=env, args=("--peering=specdeploy",), log=f"ha-{i}") for i in (0, 1)]
        with c.trial(outcome, *replicas):
            time.sleep(3)  # both see each other's peering record
            name = "ha"
            doc = deployment("build", ns, name, 0)
            c.apply(doc)
            c.wait(lambda: c.ready(ns, name), 240, f"{name} Ready")
            writes = [_writes(op) for op in replicas]
            active = max(range(2), key=lambda i: writes[i])
            standby = 1 - active
            outcome.figures["standby_writes"] = writes[standby]
            outcome.expect(writes[standby] == 0, f"the standby wrote {writes[standby]:.0f} times")
            doc["spec"]["replicas"] = 3
            c.apply(doc)
            replicas[active].kill()
            outcome.figures["takeover_seconds"] = c.wait(
                lambda: c.ready(ns, name, 3), 180, "the standby to converge"
            )
            outcome.expect(_writes(replicas[standby]) > 0, "the standby never wrote")
            c.converged(outcome, ns, [name])
    return outcome


def deleted_mid_build(c: Campaign) -> Outcome:
    outcome = Outcome(
        "deployment deleted mid-build",
        "SpeculativeDeployment deleted while its engines build",
        "children and engines garbage-collected, no orphan Job, operator healthy",
    )
    with c.scratch_namespace() as ns:
        op = c.operator(log="deleted")
        with c.trial(outcome, op):
            c.apply(deployment("build", ns, "gone", 0))
            c.wait(lambda: c.items(f"/apis/batch/v1/namespaces/{ns}/jobs"), 60, "a build Job")
            c.kubectl("delete", "sdep", "gone", "-n", ns)
            outcome.figures["cleanup_seconds"] = c.wait(
                lambda: (
                    not c.items(f"{GROUP_PATH}/namespaces/{ns}/enginebuilds")
                    and not c.items(f"/apis/batch/v1/namespaces/{ns}/jobs")
                ),
                120,
                "engines and Jobs collected",
            )
            outcome.expect(op.running and op.healthy(), "the operator is not healthy")
            c.converged(outcome, ns, [])
    return outcome


def long_names(c: Campaign) -> Outcome:
    outcome = Outcome(
        "63-character names",
        "a deployment named with 63 characters (the longest DNS label)",
        "every derived child name valid; Ready; no orphan",
    )
    with c.scratch_namespace() as ns, c.trial(outcome, c.operator(log="names")):
        name = ("n" * 62) + "x"
        c.apply(deployment("build", ns, name, 0))
        outcome.figures["converge_seconds"] = c.wait(lambda: c.ready(ns, name), 240, "Ready")
        for plural, prefix in {**OWNED_KINDS, "enginebuilds": GROUP_PATH}.items():
            for obj in c.items(f"{prefix}/namespaces/{ns}/{plural}"):
                child = obj["metadata"]["name"]
                limit = 63 if plural in ("services", "jobs") else 253
                outcome.expect(len(child) <= limit, f"{plural}/{child} longer than {limit}")
        c.converged(outcome, ns, [name])
    return outcome


def run_all(c: Campaign, fast: bool = False) -> list[Outcome]:
    points = [(p, k) for p, k in KILL_POINTS if not fast or p in FAST_KILL_POINTS]
    outcomes = [kill_at(c, point, kind, i) for i, (point, kind) in enumerate(points)]
    outcomes.append(control_plane_restart(c, "kube-apiserver"))
    outcomes.append(control_plane_restart(c, "etcd"))
    outcomes.append(takeover(c))
    outcomes.append(deleted_mid_build(c))
    outcomes.append(long_names(c))
    return outcomes


# -- record and report ----------------------------------------------------------------------------------


def render(recs: list[records.Record]) -> str:
    record = recs[0]
    rows = ["| Scenario | Injected | Checked | Result | Figures |", "|---|---|---|---|---|"]
    for o in record["figures"]["outcomes"]:
        result = "pass" if o["passed"] else "FAIL: " + "; ".join(o["problems"])[:300]
        figures = ", ".join(
            f"{k} {int(v) if float(v).is_integer() else round(v, 1)}" for k, v in o["figures"].items()
        )
        rows.append(f"| {o['scenario']} | {o['injected']} | {o['checked']} | {result} | {figures} |")
    passed = sum(1 for o in record["figures"]["outcomes"] if o["passed"])
    total = len(record["figures"]["outcomes"])
    return f"{records.provenance(record)}\n\n{passed} of {total} scenarios pass.\n\n" + "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.operator_faults",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--no-write", action="store_true", help="print only: no record, docs untouched")
    parser.add_argument("--fast", action="store_true", help="the make-test subset of kill points")
    args = parser.parse_args(argv)
    started = records.now()
    record = records.new_record(
        "reliability-operator",
        records.command_line(["python", "-m", "benchmarks.operator_faults", *argv]),
        started,
        records.machine_facts(),
        {"fast": args.fast},
    )
    state = Path(tempfile.mkdtemp(prefix="specdeploy-chaos-"))
    cluster = LocalCluster(state, autoscaling=False)
    try:
        cluster.up(timeout=180)
        campaign = Campaign(cluster)
        campaign.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
        campaign.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        outcomes = run_all(campaign, fast=args.fast)
    finally:
        cluster.down()
        shutil.rmtree(state, ignore_errors=True)
    records.finish(record, started, {"outcomes": [asdict(o) for o in outcomes]})
    print(render([record]))
    if not args.no_write:
        path = records.save(record)
        docs = records.update_docs([record["name"]])
        print(f"wrote {path.relative_to(REPO)} and {', '.join(str(d.relative_to(REPO)) for d in docs)}")
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
