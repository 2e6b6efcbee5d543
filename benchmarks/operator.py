"""The operator at scale on the simulated GPU cluster; writes docs/benchmarks.md.

python -m benchmarks.operator                      # 100 deployments, 2 min steady state (~4 min)
python -m benchmarks.operator --count 20 --steady 20 --no-write   # a smoke run

What it does, in one run on its own local cluster (a temporary directory, started and stopped here):

1. Reference: `kubectl apply` of the serving objects the operator would render for the same 100
   deployments (ConfigMap, Service, PDB, Deployment; no engine builds) in a namespace of their own; time
   until every Deployment has all replicas Ready. This is what the cluster itself (apiserver, controllers,
   scheduler, kwok) costs for the same pods. The namespace is then deleted and its pods waited out.
2. The operator (`python -m specdeploy_operator`, its own identity, so the audit log holds exactly its
   requests): `kubectl apply` of 100 SpeculativeDeployments at once; time until every one has
   `status.phase: Ready`. The engines they need are shared (several deployments per target model), so the
   run shows how many EngineBuilds and Jobs 100 deployments really cost.
3. Steady state: nothing changes for `--steady` seconds (default 120); every request the operator makes
   then is counted (status writes should be zero).

API requests come from the apiserver's audit log (only the operator's identity is audited) split by verb and
resource, and from the operator's own counter `specdeploy_operator_api_requests_total` (its writes).
"""

from __future__ import annotations

import argparse
import copy
import datetime as dt
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack" / "cluster"))

from localcluster import LocalCluster, NodePool, load_nodepools  # noqa: E402
from operatorproc import OperatorProcess  # noqa: E402
from specdeploy_operator.api import SpeculativeDeployment  # noqa: E402
from specdeploy_operator.builders import (  # noqa: E402
    OperatorSettings,
    build_configmap,
    build_default_cache_pvc,
    build_deployment,
    build_engine_builds,
    build_pdb,
    build_service,
)

OUT = REPO / "docs" / "benchmarks.md"
GROUP_PATH = "/apis/specdeploy.dev/v1alpha1"
EXAMPLE_DRAFT = REPO / "examples" / "02-draft-target-llama8b-1b-h100.yaml"
EXAMPLE_LOOKUP = REPO / "examples" / "05-prompt-lookup-llama13b.yaml"
H100, H200 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-H200"
# The operator's production defaults, except a 60 s resync, so that the steady-state window holds two full
# resyncs (the safety net that must cost nothing when nothing changed).
OPERATOR_ENV = {
    "SPECDEPLOY_GC_GRACE_SECONDS": "3600",
    "SPECDEPLOY_BUILD_BACKOFF_LIMIT": "3",
    "SPECDEPLOY_RESYNC_SECONDS": "60",
}
METRIC = "specdeploy_operator_api_requests_total"
MARKER = "<!-- figures below are written by python -m benchmarks.operator -->"


# -- the workload -------------------------------------------------------------------------------------------


def workload(count: int, namespace: str) -> list[dict[str, Any]]:
    """`count` SpeculativeDeployments: 60 % draft-target Llama 3.1 8B + 3.2 1B (example 02) in three engine
    variants (H100 with maxDraftLen 10 or 8, H200), 40 % prompt-lookup Llama 2 13B (example 05) in two
    (maxDraftLen 10 or 8). Per deployment: its own runtime (KV-cache fraction, batch size), draftLen, and
    every tenth one has 2 replicas. One GPU per replica."""
    draft_base = yaml.safe_load(EXAMPLE_DRAFT.read_text())
    lookup_base = yaml.safe_load(EXAMPLE_LOOKUP.read_text())
    n_draft = round(count * 0.6)
    docs: list[dict[str, Any]] = []
    for i in range(count):
        if i < n_draft:
            doc = copy.deepcopy(draft_base)
            variant = i % 3
            max_draft = 8 if variant == 1 else 10
            doc["metadata"] = {"name": f"llama-8b-1b-{i:03d}"}
            doc["spec"]["speculative"]["maxDraftLen"] = max_draft
            doc["spec"]["speculative"]["draftLen"] = 3 + i % 5
            doc["spec"]["placement"]["gpuProduct"] = H200 if variant == 2 else H100
            doc["spec"]["runtime"]["kvCacheFreeGpuMemFraction"] = (0.5, 0.6, 0.7, 0.8)[i % 4]
            doc["spec"]["runtime"]["maxBatchSize"] = (64, 128)[i % 2]
        else:
            doc = copy.deepcopy(lookup_base)
            variant = i % 2
            max_draft = 8 if variant else 10
            doc["metadata"] = {"name": f"llama2-13b-lookup-{i:03d}"}
            doc["spec"]["speculative"]["maxDraftLen"] = max_draft
            doc["spec"]["speculative"]["draftLen"] = max_draft - i % 3
            doc["spec"]["runtime"]["kvCacheFreeGpuMemFraction"] = (0.7, 0.8, 0.9)[i % 3]
        doc["metadata"]["namespace"] = namespace
        if i % 10 == 9:
            doc["spec"]["replicas"] = 2
        docs.append(doc)
    return docs


@dataclass(frozen=True)
class Plan:
    """What the workload needs, rendered offline by the operator's own builders."""

    engines: dict[str, int]  # EngineBuild name -> deployments using it
    gpus: dict[str, int]  # GPU product -> GPUs the serving pods request
    serving: list[dict[str, Any]]  # ConfigMap, Service, PDB, Deployment of every deployment (reference)


def plan(docs: Iterable[dict[str, Any]], settings: OperatorSettings, ref_namespace: str) -> Plan:
    engines: Counter[str] = Counter()
    gpus: Counter[str] = Counter()
    serving: list[dict[str, Any]] = []
    for doc in docs:
        sdep = SpeculativeDeployment.model_validate(doc)
        builds = build_engine_builds(sdep, settings)
        engines.update(e["metadata"]["name"] for e in builds)
        product = sdep.spec.placement.gpu_product or settings.default_gpu_product
        gpus[product] += sdep.spec.replicas * sdep.spec.gpus_per_replica
        ref_doc = copy.deepcopy(doc)
        ref_doc["metadata"]["namespace"] = ref_namespace
        ref = SpeculativeDeployment.model_validate(ref_doc)
        ref_builds = build_engine_builds(ref, settings)
        for obj in (
            build_configmap(ref, ref_builds, settings),
            build_service(ref),
            build_pdb(ref),
            build_deployment(ref, ref_builds, settings),
        ):
            obj["metadata"].pop("ownerReferences", None)  # plain objects: nothing owns them
            serving.append(obj)
    return Plan(dict(engines), dict(gpus), serving)


def bench_pools(gpus: Mapping[str, int], builds: int) -> list[NodePool]:
    """Extra GPU nodes so that every replica fits next to the default pools (2 x 8 H100, 1 x 8 H200), with
    room for the build pods and a margin of one node."""
    defaults = {p.gpu.product: p for p in load_nodepools(REPO / "hack/cluster/nodepools.yaml") if p.gpu}
    pools = []
    for product, needed in sorted(gpus.items()):
        base = defaults[product]
        assert base.gpu is not None
        have = base.nodes * base.gpu.count
        extra = max(0, -(-(needed + builds - have) // base.gpu.count)) + 1
        pools.append(
            NodePool(
                name=f"bench-{base.name}",
                nodes=extra,
                instance_type=base.instance_type,
                cpu=base.cpu,
                memory=base.memory,
                pods=base.pods,
                gpu=base.gpu,
            )
        )
    return pools


# -- cluster helpers ----------------------------------------------------------------------------------------


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
            timeout=300,
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
            lambda: self._exists(f"/api/v1/namespaces/{name}/serviceaccounts/default"),
            60,
            f"default ServiceAccount in {name}",
        )

    def _exists(self, path: str) -> bool:
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
            time.sleep(0.5)
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


# -- the operator -------------------------------------------------------------------------------------------


# -- request accounting -----------------------------------------------------------------------------------


def parse_time(text: str) -> float:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


@dataclass
class AuditEntry:
    received: float
    verb: str
    resource: str
    code: int


def read_audit(path: Path) -> list[AuditEntry]:
    entries = []
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        event = json.loads(line)
        if event.get("stage") != "ResponseComplete" and event.get("stage") != "Panic":
            continue
        ref = event.get("objectRef") or {}
        if ref.get("resource"):
            resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        else:
            resource = "(non-resource) " + str(event.get("requestURI", "")).split("?")[0]
        entries.append(
            AuditEntry(
                parse_time(event["requestReceivedTimestamp"]),
                str(event.get("verb")),
                resource,
                int((event.get("responseStatus") or {}).get("code", 0)),
            )
        )
    return entries


def window(entries: Iterable[AuditEntry], start: float, end: float) -> list[AuditEntry]:
    return [e for e in entries if start <= e.received < end]


def by_verb_resource(entries: Iterable[AuditEntry]) -> Counter[tuple[str, str]]:
    return Counter((e.verb, e.resource) for e in entries)


def metric_requests(samples: Mapping[str, float]) -> Counter[tuple[str, str]]:
    """`specdeploy_operator_api_requests_total{verb,resource,code}` summed over code."""
    out: Counter[tuple[str, str]] = Counter()
    for name, value in samples.items():
        if not name.startswith(METRIC + "{"):
            continue
        labels = dict(part.split("=", 1) for part in name[len(METRIC) + 1 : -1].split(",") if "=" in part)
        key = (labels.get("verb", "").strip('"'), labels.get("resource", "").strip('"'))
        out[key] += int(value)
    return out


def diff(after: Counter[tuple[str, str]], before: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
    out = Counter(after)
    out.subtract(before)
    return Counter({k: v for k, v in out.items() if v})


def status_writes(samples: Mapping[str, float]) -> dict[str, int]:
    prefix = "specdeploy_operator_status_writes_total{"
    return {
        name[len(prefix) :].split('"')[1]: int(v) for name, v in samples.items() if name.startswith(prefix)
    }


def operator_log_problems(log: Path, since: float) -> tuple[Counter[str], list[str]]:
    """Warnings and errors in the operator's JSON log since `since` (wall clock): counts by level and
    message, and the first few lines."""
    counts: Counter[str] = Counter()
    lines: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            if line.startswith("---"):
                continue
            counts["(not JSON)"] += 1
            if len(lines) < 5:
                lines.append(line[:300])
            continue
        if entry.get("level") not in ("warning", "error", "critical"):
            continue
        counts[f"{entry['level']}: {entry.get('message', '')[:80]}"] += 1
        if len(lines) < 5:
            lines.append(line[:500])
    return counts, lines


# -- the run ------------------------------------------------------------------------------------------------


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
    machine: str
    total_seconds: float


def measure_reference(
    bench: Bench, the_plan: Plan, settings: OperatorSettings, ref_ns: str, timeout: float
) -> tuple[Rollout, float]:
    """The same serving objects applied by kubectl, no operator; then the namespace deleted and its pods
    waited out. (rollout, seconds the clean-up took)"""
    bench.namespace(ref_ns)
    bench.apply_list([build_default_cache_pvc(ref_ns, settings)])
    deployments = {o["metadata"]["name"] for o in the_plan.serving if o["kind"] == "Deployment"}
    print(f"reference: {len(the_plan.serving)} objects ({len(deployments)} Deployments) ...", flush=True)
    t0 = time.monotonic()
    bench.apply_list(the_plan.serving)
    applied = time.monotonic() - t0
    reference = watch_ready(
        bench,
        f"/apis/apps/v1/namespaces/{ref_ns}/deployments",
        names=deployments,
        ready=deployment_ready,
        describe=lambda o: f"ready {(o.get('status') or {}).get('readyReplicas', 0)}/{o['spec']['replicas']}",
        started=t0,
        apply_seconds=applied,
        timeout=timeout,
    )
    print(f"  all Ready in {reference.seconds:.1f}s", flush=True)
    t1 = time.monotonic()
    bench.cluster.api("DELETE", f"/api/v1/namespaces/{ref_ns}")
    wait(lambda: not bench.items(f"/api/v1/namespaces/{ref_ns}/pods"), 180, "reference pods to go")
    return reference, time.monotonic() - t1


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


def run(count: int, steady: float, timeout: float, keep: bool) -> Results:
    began = time.monotonic()
    settings = OperatorSettings()
    ns, ref_ns = "bench", "bench-reference"
    docs = workload(count, ns)
    the_plan = plan(docs, settings, ref_ns)
    pools = bench_pools(the_plan.gpus, len(the_plan.engines))
    state = Path(tempfile.mkdtemp(prefix="specdeploy-bench-"))
    cluster = LocalCluster(state)
    operator: OperatorProcess | None = None
    try:
        print(f"cluster in {state} ...", flush=True)
        bench = start_cluster(cluster, pools)

        reference, ref_cleanup = measure_reference(bench, the_plan, settings, ref_ns, timeout)

        # 2. The operator.
        bench.namespace(ns)
        operator = OperatorProcess(cluster.operator_kubeconfig, cluster.logs, env=OPERATOR_ENV)
        wall_operator_start = time.time()
        operator.start()
        time.sleep(3)  # kopf's initial lists and watches settle
        metrics_before = operator.metrics()
        names = {d["metadata"]["name"] for d in docs}
        print(f"operator: {count} SpeculativeDeployments ...", flush=True)
        wall_create = time.time()
        t2 = time.monotonic()
        bench.apply_list(docs)
        applied = time.monotonic() - t2
        rollout = watch_ready(
            bench,
            f"{GROUP_PATH}/namespaces/{ns}/speculativedeployments",
            names=names,
            ready=sdep_ready,
            describe=sdep_describe,
            started=t2,
            apply_seconds=applied,
            timeout=timeout,
        )
        wall_ready = time.time()
        metrics_ready = operator.metrics()
        print(f"  all Ready in {rollout.seconds:.1f}s ({len(rollout.not_ready)} not Ready)", flush=True)

        # 3. Steady state.
        print(f"steady state: {steady:.0f}s ...", flush=True)
        time.sleep(steady)
        wall_steady_end = time.time()
        metrics_end = operator.metrics()

        engines, jobs, job_pods = inventory(bench, ns)
        operator.stop()  # its watches end: the audit log gets their ResponseComplete
        time.sleep(3)  # the audit log is written in batches (max wait 1 s)
        audit = read_audit(cluster.audit_log)
        problems, lines = operator_log_problems(operator.log, wall_operator_start)
        replicas = sum(int(d["spec"].get("replicas", 1)) for d in docs)
        return Results(
            count=count,
            replicas=replicas,
            pools=pools,
            plan=the_plan,
            reference=reference,
            operator=rollout,
            ref_cleanup_seconds=ref_cleanup,
            audit_startup=window(audit, wall_operator_start, wall_create),
            audit_rollout=window(audit, wall_create, wall_ready),
            audit_steady=window(audit, wall_ready, wall_steady_end),
            metric_rollout=diff(metric_requests(metrics_ready), metric_requests(metrics_before)),
            metric_steady=diff(metric_requests(metrics_end), metric_requests(metrics_ready)),
            status_writes_rollout={
                k: v - status_writes(metrics_before).get(k, 0)
                for k, v in status_writes(metrics_ready).items()
            },
            status_writes_steady={
                k: v - status_writes(metrics_ready).get(k, 0) for k, v in status_writes(metrics_end).items()
            },
            steady_seconds=wall_steady_end - wall_ready,
            engine_builds=len(engines),
            engine_phases=Counter(str((e.get("status") or {}).get("phase")) for e in engines),
            jobs=jobs,
            job_pods=job_pods,
            log_problems=problems,
            log_lines=lines,
            machine=machine(),
            total_seconds=time.monotonic() - began,
        )
    finally:
        if operator is not None:
            operator.stop()
        cluster.down()
        if keep:
            print(f"kept {state} (logs/operator.log, logs/audit.log)")
        else:
            shutil.rmtree(state, ignore_errors=True)


def machine() -> str:
    mem = ""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem = f", {int(line.split()[1]) / 1024**2:.0f} GiB memory"
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (
        f"{os.cpu_count()} CPU cores{mem}, {platform.system()} {platform.release()}, "
        f"Python {platform.python_version()}; load average {load:.1f} when the run ended "
        "(other work was running on the machine)"
    )


# -- report -------------------------------------------------------------------------------------------------


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]
    )


def request_table(entries: list[AuditEntry], metric: Counter[tuple[str, str]], per: int) -> str:
    audit = by_verb_resource(e for e in entries if e.verb != "watch")
    keys = sorted(set(audit) | set(metric), key=lambda k: (-audit.get(k, 0), k))
    rows = ["| verb | resource | audit log | per deployment | operator metric |", "|---|---|---:|---:|---:|"]
    for verb_res in keys:
        verb, res = verb_res
        rows.append(
            f"| {verb} | {res} | {audit.get(verb_res, 0)} | {audit.get(verb_res, 0) / per:.2f} | "
            f"{metric.get(verb_res, 0) or '-'} |"
        )
    total_audit = sum(audit.values())
    rows.append(
        f"| **all but watch** | | **{total_audit}** | **{total_audit / per:.2f}** | "
        f"**{sum(metric.values())}** |"
    )
    return "\n".join(rows)


def watch_table(entries: list[AuditEntry]) -> str:
    watches = Counter(e.resource for e in entries if e.verb == "watch")
    if not watches:
        return "none opened"
    return ", ".join(f"{res} {n}" for res, n in sorted(watches.items()))


def normalise_metric(metric: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
    """The metric's HTTP methods as the audit log's verbs."""
    verbs = {"PATCH": "patch", "POST": "create", "DELETE": "delete", "GET": "get", "PUT": "update"}
    out: Counter[tuple[str, str]] = Counter()
    for (verb, res), n in metric.items():
        out[(verbs.get(verb, verb.lower()), res)] += n
    return out


def report(r: Results) -> str:
    ref, op = r.reference, r.operator
    ratio = op.seconds / ref.seconds if ref.seconds else float("nan")
    shared = r.plan.engines
    steady_requests = [e for e in r.audit_steady if e.verb != "watch"]
    steady_status = [e for e in steady_requests if e.resource.endswith("/status")]
    lines = [
        f"Run: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, "
        f"{r.total_seconds / 60:.1f} min in all. Machine: {r.machine}.",
        "",
        f"Workload: {r.count} SpeculativeDeployments, {r.replicas} replicas of one GPU, "
        f"{r.plan.gpus} GPUs by product; {len(shared)} distinct engines "
        f"(deployments per engine: {', '.join(str(n) for n in sorted(shared.values(), reverse=True))}). "
        "Extra simulated nodes: "
        + ", ".join(f"{p.name} {p.nodes} x {p.gpu.count if p.gpu else 0} GPUs" for p in r.pools)
        + " next to the default pools.",
        "",
        "### Time to Ready",
        "",
        "| | all Ready | `kubectl apply` took | per object p50 / p90 / max | not Ready |",
        "|---|---:|---:|---:|---:|",
        f"| reference: kubectl applies the rendered serving objects | {ref.seconds:.1f} s | "
        f"{ref.apply_seconds:.1f} s | {pct(ref.per_object, 50):.1f} / {pct(ref.per_object, 90):.1f} / "
        f"{max(ref.per_object, default=float('nan')):.1f} s | {len(ref.not_ready)} |",
        f"| operator: {r.count} SpeculativeDeployments | {op.seconds:.1f} s | {op.apply_seconds:.1f} s | "
        f"{pct(op.per_object, 50):.1f} / {pct(op.per_object, 90):.1f} / "
        f"{max(op.per_object, default=float('nan')):.1f} s | {len(op.not_ready)} |",
        f"| **ratio operator / reference** | **{ratio:.2f}** | | | |",
        "",
        "Both clocks start when `kubectl apply` of the whole list starts and stop at the poll (every 0.5 s) "
        "that sees the last object ready. The operator's path also holds the engine builds (kwok completes a "
        "build pod 2 s after it runs) before any serving object exists.",
        "",
    ]
    if op.not_ready:
        lines += ["Not Ready at the timeout:", ""]
        lines += [f"- `{n}`: {what}" for n, what in list(op.not_ready.items())[:10]]
        lines.append("")
    lines += [
        "### Shared builds",
        "",
        f"EngineBuilds: **{r.engine_builds}** (expected from the builders: {len(shared)}; phases "
        f"{dict(r.engine_phases)}), build Jobs: **{r.jobs}**, build pods: {r.job_pods}, for {r.count} "
        "deployments.",
        "",
        f"### API requests while {r.count} deployments roll out (per deployment = / {r.count})",
        "",
        "From the audit log (every request of the operator's identity, received between the start of "
        "`kubectl apply` and the moment all were Ready), next to the operator's own counter "
        f"`{METRIC}` over the same interval (it counts the operator's writes only; kopf's lists and "
        "watches are not in it).",
        "",
        request_table(r.audit_rollout, normalise_metric(r.metric_rollout), r.count),
        "",
        f"Watches opened in that interval (long-lived, counted apart): {watch_table(r.audit_rollout)}. "
        f"At operator start-up, before any deployment existed: "
        f"{sum(1 for e in r.audit_startup if e.verb != 'watch')} requests "
        f"({dict(Counter(e.verb for e in r.audit_startup if e.verb != 'watch'))}) and watches "
        f"{watch_table(r.audit_startup)}.",
        "",
        "Status writes (operator metric `specdeploy_operator_status_writes_total`): "
        f"{r.status_writes_rollout}.",
        "",
        f"### Steady state ({r.steady_seconds:.0f} s after all were Ready, resync every "
        f"{OPERATOR_ENV['SPECDEPLOY_RESYNC_SECONDS']} s)",
        "",
        f"Requests other than watches in the audit log: **{len(steady_requests)}**, of which status writes: "
        f"**{len(steady_status)}**; the operator's counter: {sum(r.metric_steady.values())} writes, status "
        f"writes by kind {r.status_writes_steady}.",
        "",
    ]
    if steady_requests:
        lines += [request_table(r.audit_steady, normalise_metric(r.metric_steady), r.count), ""]
    steady_watches = [e for e in r.audit_steady if e.verb == "watch"]
    lines += [
        f"Watches opened (re-opened by kopf) in the window: {len(steady_watches)}.",
        "",
        "### Operator log",
        "",
    ]
    if r.log_problems:
        lines += [f"- {n} x {msg}" for msg, n in r.log_problems.most_common(10)]
        lines += ["", "First lines:", "", "```", *r.log_lines, "```", ""]
    else:
        lines += ["No warning or error in the operator's log.", ""]
    return "\n".join(lines)


HEADER = """# Operator benchmark

Command: `python -m benchmarks.operator` (or `make bench-operator`; about 4 minutes on 2 CPU cores). The
script rewrites everything below the marker; the text above it is kept.

**Method.** One run on its own local cluster (`hack/cluster/localcluster.py` in a temporary directory: a real
etcd, kube-apiserver, controller-manager and scheduler, kwok playing the kubelet of simulated GPU nodes; see
[local-cluster.md](local-cluster.md)), started and stopped by the benchmark. Extra simulated GPU nodes are
added so that every replica fits. The workload is 100 SpeculativeDeployments derived from
[examples/02](../examples/02-draft-target-llama8b-1b-h100.yaml) (draft-target Llama 3.1 8B + 3.2 1B, three
engine variants: H100 with `maxDraftLen` 10 or 8, H200) and
[examples/05](../examples/05-prompt-lookup-llama13b.yaml) (prompt lookup on Llama 2 13B, two engine
variants), each with its own runtime settings and `draftLen`, every tenth with 2 replicas; one GPU per
replica. Deployments that need the same engine (as the operator's builders hash it) share one EngineBuild
and one build Job; the figures give how many distinct engines that makes.

1. *Reference* (the ratio's denominator, measured in the same run): `kubectl apply --server-side` of the
   serving objects the operator's builders render for the same 100 deployments (ConfigMap, Service,
   PodDisruptionBudget, Deployment: the same pods), in a namespace of their own, without the operator; time
   until every Deployment has all replicas Ready. That is what the cluster itself (apiserver, controllers,
   scheduler, kwok) costs for these pods. The namespace is then deleted and its pods waited out.
2. *Operator*: `python -m specdeploy_operator` as a child process (as the integration tests run it, with
   its own identity; production settings but a 60 s resync), then one `kubectl apply --server-side` of the 100
   SpeculativeDeployments; time until every one shows `status.phase: Ready` for its current generation. On
   this path the operator creates the EngineBuilds, their Jobs (kwok completes a build pod 2 s after it runs),
   then the serving objects.
3. *Steady state*: nothing changes for 2 minutes; every request the operator makes is counted.

Requests are counted from the kube-apiserver's audit log, which records only the operator's identity (one line
per request at `ResponseComplete`; watches are long-lived and listed apart), split by verb and resource, and
compared with the operator's own counter `specdeploy_operator_api_requests_total` (its writes; kopf's lists
and watches are not in it). Figures are those of one run on a shared 2-core machine: the times move with the
machine's load from run to run, the request counts do not.
"""


def write(markdown: str, path: Path, interpretation: str) -> None:
    existing = path.read_text() if path.exists() else ""
    head = existing.split(MARKER)[0].rstrip() + "\n" if MARKER in existing else HEADER
    path.write_text(f"{head}\n{MARKER}\n\n## Figures\n\n{markdown}\n{interpretation}")


def interpret(r: Results) -> str:
    ratio = r.operator.seconds / r.reference.seconds if r.reference.seconds else float("nan")
    rollout = [e for e in r.audit_rollout if e.verb != "watch"]
    steady = [e for e in r.audit_steady if e.verb != "watch"]
    reads = sum(1 for e in rollout if e.verb in ("get", "list"))
    n = by_verb_resource(rollout)
    children = sum(n[("patch", k)] for k in ("configmaps", "services", "poddisruptionbudgets", "deployments"))
    parts = [
        "## Interpretation",
        "",
        f"- Time: the operator brought {r.count} deployments to Ready in {r.operator.seconds:.1f} s, "
        f"{ratio:.2f} x the {r.reference.seconds:.1f} s the cluster needs for the same pods applied "
        "directly. "
        "The difference is the operator's own path: engine builds first (Job, kwok's 2 s, status roll-up), "
        "then the serving objects, then the readiness roll-up into status.",
        f"- Requests: {len(rollout) / r.count:.2f} per deployment while rolling out ({len(rollout)} in all, "
        f"{reads} of them reads: the operator reads from kopf's watch-fed indexes). Per deployment: "
        f"{children / r.count:.2f} applies of its serving objects (ConfigMap, Service, PDB, Deployment), "
        f"{n[('patch', 'speculativedeployments/status')] / r.count:.2f} status writes, "
        f"{n[('create', 'events')] / r.count:.2f} events (milestones). Shared: "
        f"{n[('patch', 'enginebuilds')]} EngineBuild applies for {r.engine_builds} EngineBuilds, "
        f"{n[('patch', 'enginebuilds/status')]} EngineBuild status writes, {n[('patch', 'jobs')]} Job "
        f"applies, {n[('patch', 'persistentvolumeclaims')]} applies of the one shared cache claim. Applies "
        "beyond one per EngineBuild or claim come from deployments that needed the same new object before "
        "the operator's watch showed it; server-side apply makes them idempotent (extra requests, no "
        "duplicate objects).",
        f"- Shared builds: {r.engine_builds} EngineBuilds and {r.jobs} Jobs for {r.count} deployments "
        f"({len(r.plan.engines)} distinct engines by the builders).",
        f"- Steady state: {len(steady)} requests other than watches in {r.steady_seconds:.0f} s"
        + (" - status is written only when it changes and resyncs cost nothing." if not steady else "."),
        "",
    ]
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.operator", description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=100, help="SpeculativeDeployments to create")
    parser.add_argument("--steady", type=float, default=120.0, help="seconds of steady state to watch")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for Ready")
    parser.add_argument("--output", type=Path, default=OUT, help="markdown file to write")
    parser.add_argument("--no-write", action="store_true", help="print only")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory (logs)")
    args = parser.parse_args(argv)
    results = run(args.count, args.steady, args.timeout, args.keep)
    markdown = report(results)
    interpretation = interpret(results)
    print()
    print(markdown)
    print(interpretation)
    if not args.no_write:
        write(markdown, args.output, interpretation)
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
