"""One run of the operator benchmark on its own local cluster (started and stopped here):

1. Reference: `kubectl apply` of the serving objects the operator would render for the same deployments
   (ConfigMap, Service, PDB, Deployment; no engine builds) in a namespace of their own; time until every
   Deployment has all replicas Ready. This is what the cluster itself (apiserver, controllers, scheduler,
   kwok) costs for the same pods. The namespace is then deleted and waited out (every object in it gone).
2. The operator (`python -m specdeploy_operator`, its own identity, so the audit log holds exactly its
   requests): `kubectl apply` of the SpeculativeDeployments at once; time until every one has
   `status.phase: Ready`. The engines they need are shared (several deployments per target model).
3. Steady state: nothing changes for `steady` seconds; every request the operator makes then is counted
   (status writes should be zero).

The operator's resident memory and CPU time are read from /proc at its start, when all are Ready and at the
end of the steady state.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.nodepools import NodePool
from specdeploy_localcluster.operatorproc import OperatorProcess
from specdeploy_operator.builders import OperatorSettings, build_default_cache_pvc

from .accounting import (
    AuditEntry,
    ProcessUsage,
    diff,
    metric_requests,
    operator_log_problems,
    process_usage,
    read_audit,
    status_writes,
    window,
)
from .cluster import (
    GROUP_PATH,
    Bench,
    Rollout,
    deployment_ready,
    group_set_ready,
    inventory,
    sdep_describe,
    sdep_ready,
    start_cluster,
    wait,
    watch_ready,
)
from .workload import Plan, bench_pools, multinode_workload, plan, workload

__all__ = ["OPERATOR_ENV", "OperatorRun", "Results", "run"]

# The operator's production defaults, except a 60 s resync, so that the steady-state window holds two full
# resyncs (the safety net that must cost nothing when nothing changed).
OPERATOR_ENV = {
    "SPECDEPLOY_GC_GRACE_SECONDS": "3600",
    "SPECDEPLOY_BUILD_BACKOFF_LIMIT": "3",
    "SPECDEPLOY_RESYNC_SECONDS": "60",
}


@dataclass
class Results:
    count: int
    replicas: int
    pools: list[NodePool]
    plan: Plan
    reference: Rollout
    operator: Rollout
    ref_cleanup_seconds: float
    audit_rollout: list[AuditEntry]
    audit_startup: list[AuditEntry]
    audit_steady: list[AuditEntry]
    metric_rollout: Counter[tuple[str, str]]
    metric_steady: Counter[tuple[str, str]]
    status_writes_rollout: dict[str, int]
    status_writes_steady: dict[str, int]
    steady_seconds: float
    engine_builds: int
    engine_phases: Counter[str]
    jobs: int
    job_pods: int
    log_problems: Counter[str]
    log_lines: list[str]
    usage: dict[str, ProcessUsage]  # the operator's at "started", "ready" and "end"


def poll_interval(count: int) -> float:
    """How often the rollouts are polled: a list of every object each time, so less often for many."""
    return 0.5 if count <= 200 else 1.0


def measure_reference(
    bench: Bench, the_plan: Plan, settings: OperatorSettings, ref_ns: str, timeout: float
) -> tuple[Rollout, float]:
    """The same serving objects applied by kubectl, no operator; then the namespace deleted and its pods
    waited out. (rollout, seconds the clean-up took)"""
    bench.namespace(ref_ns)
    bench.apply_list([build_default_cache_pvc(ref_ns, settings)])
    kind = the_plan.workload_kind
    deployments = {o["metadata"]["name"] for o in the_plan.serving if o["kind"] == kind}
    print(f"reference: {len(the_plan.serving)} objects ({len(deployments)} {kind}s) ...", flush=True)
    t0 = time.monotonic()
    bench.apply_list(the_plan.serving)
    applied = time.monotonic() - t0
    path = (
        f"/apis/apps/v1/namespaces/{ref_ns}/deployments"
        if kind == "Deployment"
        else f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/{ref_ns}/leaderworkersets"
    )
    reference = watch_ready(
        bench,
        path,
        names=deployments,
        ready=deployment_ready if kind == "Deployment" else group_set_ready,
        describe=lambda o: f"ready {(o.get('status') or {}).get('readyReplicas', 0)}/{o['spec']['replicas']}",
        started=t0,
        apply_seconds=applied,
        timeout=timeout,
        interval=poll_interval(len(deployments)),
    )
    print(f"  all Ready in {reference.seconds:.1f}s", flush=True)
    t1 = time.monotonic()
    bench.cluster.api("DELETE", f"/api/v1/namespaces/{ref_ns}")
    # Until the namespace is gone, not only its pods: its ConfigMaps, Services, PDBs and Deployments carry the
    # operator's labels, and an operator started among thousands of them being deleted would list, index and
    # watch them all go (at 1 000 deployments that held its first reconcile back by minutes).
    wait(
        lambda: not bench.exists(f"/api/v1/namespaces/{ref_ns}"),
        max(300.0, len(deployments) * 0.9),
        "the reference namespace to go",
        interval=2.0,
    )
    return reference, time.monotonic() - t1


@dataclass
class OperatorRun:
    """Steps 2 and 3: the rollout, the wall clock at each boundary (to cut the audit log), the operator's
    metrics and process usage at the start, at all Ready and at the end."""

    rollout: Rollout
    wall_start: float
    wall_create: float
    wall_ready: float
    wall_end: float
    metrics: dict[str, dict[str, float]]
    usage: dict[str, ProcessUsage]


def measure_operator(
    bench: Bench, operator: OperatorProcess, docs: list[dict[str, Any]], *, steady: float, timeout: float
) -> OperatorRun:
    ns = str(docs[0]["metadata"]["namespace"])
    bench.namespace(ns)
    wall_start = time.time()
    operator.start()
    time.sleep(3)  # kopf's initial lists and watches settle
    assert operator.proc is not None
    pid = operator.proc.pid
    usage = {"started": process_usage(pid)}
    metrics = {"started": operator.metrics()}
    print(f"operator: {len(docs)} SpeculativeDeployments ...", flush=True)
    wall_create = time.time()
    t2 = time.monotonic()
    bench.apply_list(docs)
    applied = time.monotonic() - t2
    rollout = watch_ready(
        bench,
        f"{GROUP_PATH}/namespaces/{ns}/speculativedeployments",
        names={d["metadata"]["name"] for d in docs},
        ready=sdep_ready,
        describe=sdep_describe,
        started=t2,
        apply_seconds=applied,
        timeout=timeout,
        interval=poll_interval(len(docs)),
    )
    wall_ready = time.time()
    usage["ready"], metrics["ready"] = process_usage(pid), operator.metrics()
    print(f"  all Ready in {rollout.seconds:.1f}s ({len(rollout.not_ready)} not Ready)", flush=True)

    print(f"steady state: {steady:.0f}s ...", flush=True)
    time.sleep(steady)
    wall_end = time.time()
    usage["end"], metrics["end"] = process_usage(pid), operator.metrics()
    return OperatorRun(rollout, wall_start, wall_create, wall_ready, wall_end, metrics, usage)


def run(count: int, steady: float, timeout: float, keep: bool, multinode: bool = False) -> Results:
    settings = OperatorSettings()
    ns, ref_ns = "bench", "bench-reference"
    docs = multinode_workload(count, ns) if multinode else workload(count, ns)
    the_plan = plan(docs, settings, ref_ns)
    pools = bench_pools(the_plan.gpus, len(the_plan.engines))
    state = Path(tempfile.mkdtemp(prefix="specdeploy-bench-"))
    cluster = LocalCluster(state)
    operator: OperatorProcess | None = None
    try:
        print(f"cluster in {state} ({sum(p.nodes for p in pools)} extra nodes) ...", flush=True)
        bench = start_cluster(cluster, pools)
        reference, ref_cleanup = measure_reference(bench, the_plan, settings, ref_ns, timeout)
        operator = OperatorProcess(cluster.operator_kubeconfig, cluster.logs, env=OPERATOR_ENV)
        m = measure_operator(bench, operator, docs, steady=steady, timeout=timeout)
        engines, jobs, job_pods = inventory(bench, ns)
        operator.stop()  # its watches end: the audit log gets their ResponseComplete
        time.sleep(3)  # the audit log is written in batches (max wait 1 s)
        audit = read_audit(cluster.audit_log)
        problems, lines = operator_log_problems(operator.log, m.wall_start)
        before, ready, end = m.metrics["started"], m.metrics["ready"], m.metrics["end"]
        return Results(
            count=count,
            replicas=sum(int(d["spec"].get("replicas", 1)) for d in docs),
            pools=pools,
            plan=the_plan,
            reference=reference,
            operator=m.rollout,
            ref_cleanup_seconds=ref_cleanup,
            audit_startup=window(audit, m.wall_start, m.wall_create),
            audit_rollout=window(audit, m.wall_create, m.wall_ready),
            audit_steady=window(audit, m.wall_ready, m.wall_end),
            metric_rollout=diff(metric_requests(ready), metric_requests(before)),
            metric_steady=diff(metric_requests(end), metric_requests(ready)),
            status_writes_rollout={
                k: v - status_writes(before).get(k, 0) for k, v in status_writes(ready).items()
            },
            status_writes_steady={
                k: v - status_writes(ready).get(k, 0) for k, v in status_writes(end).items()
            },
            steady_seconds=m.wall_end - m.wall_ready,
            engine_builds=len(engines),
            engine_phases=Counter(str((e.get("status") or {}).get("phase")) for e in engines),
            jobs=jobs,
            job_pods=job_pods,
            log_problems=problems,
            log_lines=lines,
            usage=m.usage,
        )
    finally:
        if operator is not None:
            operator.stop()
        cluster.down()
        if keep:
            print(f"kept {state} (logs/operator.log, logs/audit.log)")
        else:
            shutil.rmtree(state, ignore_errors=True)
