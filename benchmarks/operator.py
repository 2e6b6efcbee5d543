"""The operator at scale on the simulated GPU cluster; writes its record, benchmarks/results/operator.json,
and the operator block of docs/benchmarks.md rendered from it (benchmarks/operator_report.py, records.py).

python -m benchmarks.operator                      # 100 deployments, 2 min steady state (~4 min)
python -m benchmarks.operator --count 20 --steady 20 --no-write   # a smoke run: no record, docs untouched

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

from benchmarks import records  # noqa: E402
from benchmarks.operator_report import render  # noqa: E402

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
    defaults = {
        p.gpu.product: p
        for p in load_nodepools(REPO / "hack/cluster/nodepools.yaml")
        if p.gpu and p.gpu.resource == "nvidia.com/gpu"  # whole GPUs: not the MIG pool of the same product
    }
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
        )
    finally:
        if operator is not None:
            operator.stop()
        cluster.down()
        if keep:
            print(f"kept {state} (logs/operator.log, logs/audit.log)")
        else:
            shutil.rmtree(state, ignore_errors=True)


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]
    )


def normalise_metric(metric: Counter[tuple[str, str]]) -> Counter[tuple[str, str]]:
    """The metric's HTTP methods as the audit log's verbs."""
    verbs = {"PATCH": "patch", "POST": "create", "DELETE": "delete", "GET": "get", "PUT": "update"}
    out: Counter[tuple[str, str]] = Counter()
    for (verb, res), n in metric.items():
        out[(verbs.get(verb, verb.lower()), res)] += n
    return out


def request_rows(entries: list[AuditEntry], metric: Counter[tuple[str, str]]) -> list[dict[str, Any]]:
    """Requests other than watches by verb and resource, audit log next to the operator's counter, most
    frequent first."""
    audit = by_verb_resource(e for e in entries if e.verb != "watch")
    metric = normalise_metric(metric)
    keys = sorted(set(audit) | set(metric), key=lambda k: (-audit.get(k, 0), k))
    return [
        {
            "verb": verb,
            "resource": res,
            "audit": audit.get((verb, res), 0),
            "metric": metric.get((verb, res), 0),
        }
        for verb, res in keys
    ]


def watch_counts(entries: list[AuditEntry]) -> dict[str, int]:
    return dict(sorted(Counter(e.resource for e in entries if e.verb == "watch").items()))


def rollout_figures(rollout: Rollout) -> dict[str, Any]:
    return {
        "seconds": round(rollout.seconds, 2),
        "apply_seconds": round(rollout.apply_seconds, 2),
        "p50": round(pct(rollout.per_object, 50), 2),
        "p90": round(pct(rollout.per_object, 90), 2),
        "max": round(max(rollout.per_object, default=float("nan")), 2),
        "not_ready": rollout.not_ready,
    }


def figures(r: Results) -> dict[str, Any]:
    """What the record keeps of a run (JSON): the counts and times the docs render, no raw audit log."""
    return {
        "count": r.count,
        "replicas": r.replicas,
        "gpus_by_product": dict(sorted(r.plan.gpus.items())),
        "deployments_per_engine": sorted(r.plan.engines.values(), reverse=True),
        "extra_pools": [
            {"name": p.name, "nodes": p.nodes, "gpus": p.gpu.count if p.gpu else 0} for p in r.pools
        ],
        "reference": rollout_figures(r.reference),
        "operator": rollout_figures(r.operator),
        "reference_cleanup_seconds": round(r.ref_cleanup_seconds, 2),
        "requests_rollout": request_rows(r.audit_rollout, r.metric_rollout),
        "watches_rollout": watch_counts(r.audit_rollout),
        "startup_requests_by_verb": dict(
            sorted(Counter(e.verb for e in r.audit_startup if e.verb != "watch").items())
        ),
        "watches_startup": watch_counts(r.audit_startup),
        "requests_steady": request_rows(r.audit_steady, r.metric_steady),
        "watches_steady": sum(1 for e in r.audit_steady if e.verb == "watch"),
        "metric_writes_steady": sum(r.metric_steady.values()),
        "status_writes_rollout": dict(sorted(r.status_writes_rollout.items())),
        "status_writes_steady": dict(sorted(r.status_writes_steady.items())),
        "steady_seconds": round(r.steady_seconds, 1),
        "resync_seconds": int(OPERATOR_ENV["SPECDEPLOY_RESYNC_SECONDS"]),
        "engine_builds": r.engine_builds,
        "engine_phases": dict(sorted(r.engine_phases.items())),
        "jobs": r.jobs,
        "job_pods": r.job_pods,
        "log_problems": [[msg, n] for msg, n in r.log_problems.most_common(10)],
        "log_lines": r.log_lines,
    }


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.operator", description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=100, help="SpeculativeDeployments to create")
    parser.add_argument("--steady", type=float, default=120.0, help="seconds of steady state to watch")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for Ready")
    parser.add_argument("--no-write", action="store_true", help="print only: no record, docs untouched")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory (logs)")
    args = parser.parse_args(argv)
    started = records.now()
    record = records.new_record(
        "operator",
        records.command_line(["python", "-m", "benchmarks.operator", *argv]),
        started,
        records.machine_facts(),
        {"count": args.count, "steady": args.steady, "timeout": args.timeout, "operator_env": OPERATOR_ENV},
    )
    results = run(args.count, args.steady, args.timeout, args.keep)
    records.finish(record, started, figures(results))
    print()
    print(render([record]))
    if not args.no_write:
        path = records.save(record)
        docs = records.update_docs([record["name"]])
        print(f"wrote {path.relative_to(REPO)} and {', '.join(str(d.relative_to(REPO)) for d in docs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
