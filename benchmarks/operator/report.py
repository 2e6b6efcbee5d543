"""The operator benchmark's blocks of docs/benchmarks.md, rendered from the records that
`python -m benchmarks.operator [--count 1000]` writes (benchmarks/results/operator.json, operator-1000.json;
see benchmarks/records.py). The record's figures are what `benchmarks.operator.figures.figures` keeps of a
run: counts and times, no raw audit log."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.records import Record, provenance

METRIC = "specdeploy_operator_api_requests_total"
Figures = Mapping[str, Any]


def request_table(rows: Sequence[Mapping[str, Any]], per: int) -> str:
    lines = ["| verb | resource | audit log | per deployment | operator metric |", "|---|---|---:|---:|---:|"]
    for row in rows:
        lines.append(
            f"| {row['verb']} | {row['resource']} | {row['audit']} | {row['audit'] / per:.2f} | "
            f"{row['metric'] or '-'} |"
        )
    total_audit = sum(int(row["audit"]) for row in rows)
    total_metric = sum(int(row["metric"]) for row in rows)
    lines.append(
        f"| **all but watch** | | **{total_audit}** | **{total_audit / per:.2f}** | **{total_metric}** |"
    )
    return "\n".join(lines)


def watch_list(watches: Mapping[str, int]) -> str:
    if not watches:
        return "none opened"
    return ", ".join(f"{res} {n}" for res, n in sorted(watches.items()))


def _rollout_row(label: str, r: Mapping[str, Any]) -> str:
    return (
        f"| {label} | {r['seconds']:.1f} s | {r['apply_seconds']:.1f} s | {r['p50']:.1f} / {r['p90']:.1f} / "
        f"{r['max']:.1f} s | {len(r['not_ready'])} |"
    )


def process_section(f: Figures) -> list[str]:
    """The operator process's memory and CPU time (records from before these were measured have none)."""
    p = f.get("operator_process")
    if p is None:
        return []
    seconds = f["operator"]["seconds"]
    return [
        "### The operator process",
        "",
        "| | resident memory | CPU seconds (user + system) |",
        "|---|---:|---:|",
        f"| start-up (3 s after start, before any deployment) | {p['rss_mib_started']:.0f} MiB | "
        f"{p['cpu_seconds_startup']:.1f} |",
        f"| rollout (until all Ready) | {p['rss_mib_ready']:.0f} MiB at the end | "
        f"{p['cpu_seconds_rollout']:.1f} ({p['cpu_seconds_rollout'] / seconds:.2f} of a core over "
        f"{seconds:.0f} s) |",
        f"| steady state ({f['steady_seconds']:.0f} s) | {p['rss_mib_end']:.0f} MiB at the end | "
        f"{p['cpu_seconds_steady']:.1f} |",
        f"| **peak** | **{p['peak_rss_mib']:.0f} MiB** | |",
        "",
        "From /proc of the operator's process (VmRSS, VmHWM for the peak; utime + stime).",
        "",
    ]


def report(f: Figures) -> str:
    ref, op = f["reference"], f["operator"]
    ratio = op["seconds"] / ref["seconds"] if ref["seconds"] else float("nan")
    per_engine = f["deployments_per_engine"]
    steady = f["requests_steady"]
    steady_total = sum(int(row["audit"]) for row in steady)
    steady_status = sum(int(row["audit"]) for row in steady if str(row["resource"]).endswith("/status"))
    startup = f["startup_requests_by_verb"]
    kind, nodes = f.get("workload_kind", "Deployment"), f.get("nodes_per_replica", 1)
    shape = "of one GPU" if nodes == 1 else f"of {nodes} nodes each ({kind} groups of {nodes} pods)"
    shared = ", ".join(str(n) for n in per_engine)
    engines = (
        f"{len(per_engine)} distinct engines (deployments per engine: {shared})"
        if per_engine
        else "no engine build (the checkpoint is loaded as it is)"
    )
    lines = [
        f"Workload: {f['count']} SpeculativeDeployments, {f['replicas']} replicas {shape}, "
        f"{f['gpus_by_product']} GPUs by product; {engines}. Extra simulated nodes: "
        + ", ".join(f"{p['name']} {p['nodes']} x {p['gpus']} GPUs" for p in f["extra_pools"])
        + " next to the default pools.",
        "",
        "### Time to Ready",
        "",
        "| | all Ready | `kubectl apply` took | per object p50 / p90 / max | not Ready |",
        "|---|---:|---:|---:|---:|",
        _rollout_row("reference: kubectl applies the rendered serving objects", ref),
        _rollout_row(f"operator: {f['count']} SpeculativeDeployments", op),
        f"| **ratio operator / reference** | **{ratio:.2f}** | | | |",
        "",
        "Both clocks start when `kubectl apply` of the whole list starts and stop at the poll "
        f"(every {f.get('poll_seconds', 0.5):g} s) "
        "that sees the last object ready; polling starts when `kubectl apply` returns, so objects ready "
        "before that count as ready then. The operator's path also holds the engine builds (kwok completes a "
        "build pod 2 s after it runs) before any serving object exists. Between the two, the reference "
        f"namespace was deleted in {f['reference_cleanup_seconds']:.0f} s (before the operator started).",
        "",
    ]
    if op["not_ready"]:
        lines += ["Not Ready at the timeout:", ""]
        lines += [f"- `{n}`: {what}" for n, what in list(op["not_ready"].items())[:10]]
        lines.append("")
    lines += [
        "### Shared builds",
        "",
        f"EngineBuilds: **{f['engine_builds']}** (expected from the builders: {len(per_engine)}; phases "
        f"{f['engine_phases']}), build Jobs: **{f['jobs']}**, build pods: {f['job_pods']}, for {f['count']} "
        "deployments.",
        "",
        f"### API requests while {f['count']} deployments roll out (per deployment = / {f['count']})",
        "",
        "From the audit log (every request of the operator's identity, received between the start of "
        "`kubectl apply` and the moment all were Ready), next to the operator's own counter "
        f"`{METRIC}` over the same interval (it counts the operator's own client's requests: its writes "
        "and the event lists of build Jobs without a pod; kopf's lists and watches are not in it).",
        "",
        request_table(f["requests_rollout"], f["count"]),
        "",
        f"Watches opened in that interval (long-lived, counted apart): {watch_list(f['watches_rollout'])}. "
        f"At operator start-up, before any deployment existed: {sum(startup.values())} requests "
        f"({startup}) and watches {watch_list(f['watches_startup'])}.",
        "",
        "Status writes (operator metric `specdeploy_operator_status_writes_total`): "
        f"{f['status_writes_rollout']}.",
        "",
        f"### Steady state ({f['steady_seconds']:.0f} s after all were Ready, resync every "
        f"{f['resync_seconds']} s)",
        "",
        f"Requests other than watches in the audit log: **{steady_total}**, of which status writes: "
        f"**{steady_status}**; the operator's counter: {f['metric_writes_steady']} writes, status "
        f"writes by kind {f['status_writes_steady']}.",
        "",
    ]
    if steady:
        lines += [request_table(steady, f["count"]), ""]
    lines += [
        f"Watches opened (re-opened by kopf) in the window: {f['watches_steady']}.",
        "",
        *process_section(f),
        "### Operator log",
        "",
    ]
    if f["log_problems"]:
        lines += [f"- {n} x {msg}" for msg, n in f["log_problems"]]
        lines += ["", "First lines:", "", "```", *f["log_lines"], "```", ""]
    else:
        lines += ["No warning or error in the operator's log.", ""]
    return "\n".join(lines)


def interpret(f: Figures) -> str:
    ref, op = f["reference"], f["operator"]
    ratio = op["seconds"] / ref["seconds"] if ref["seconds"] else float("nan")
    n = {(str(row["verb"]), str(row["resource"])): int(row["audit"]) for row in f["requests_rollout"]}
    rollout = sum(n.values())
    steady = sum(int(row["audit"]) for row in f["requests_steady"])
    reads = sum(v for (verb, _), v in n.items() if verb in ("get", "list"))
    count = f["count"]
    kind = f.get("workload_kind", "Deployment")
    workloads = "deployments" if kind == "Deployment" else "leaderworkersets"
    children = sum(
        n.get(("patch", k), 0) for k in ("configmaps", "services", "poddisruptionbudgets", workloads)
    )
    parts = [
        "## Interpretation",
        "",
        f"- Time: the operator brought {count} deployments to Ready in {op['seconds']:.1f} s, "
        f"{ratio:.2f} x the {ref['seconds']:.1f} s the cluster needs for the same pods applied directly. "
        "The difference is the operator's own path: engine builds first (Job, kwok's 2 s, status roll-up), "
        "then the serving objects, then the readiness roll-up into status. "
        f"`kubectl apply` of the {count} SpeculativeDeployments took {op['apply_seconds']:.1f} s "
        f"({op['apply_seconds'] / ref['seconds']:.2f} x the reference's whole rollout) while the operator "
        "wrote to the same API server; the operator creates a deployment's serving objects only once its "
        "SpeculativeDeployment exists.",
        f"- Requests: {rollout / count:.2f} per deployment while rolling out ({rollout} in all, "
        f"{reads} of them reads: the operator reads from kopf's watch-fed indexes). Per deployment: "
        f"{children / count:.2f} applies of its serving objects (ConfigMap, Service, PDB, {kind}), "
        f"{n.get(('patch', 'speculativedeployments/status'), 0) / count:.2f} status writes, "
        f"{n.get(('create', 'events'), 0) / count:.2f} events (milestones). Shared: "
        f"{n.get(('patch', 'enginebuilds'), 0)} EngineBuild applies for {f['engine_builds']} EngineBuilds, "
        f"{n.get(('patch', 'enginebuilds/status'), 0)} EngineBuild status writes, "
        f"{n.get(('patch', 'jobs'), 0)} Job applies, {n.get(('patch', 'persistentvolumeclaims'), 0)} applies "
        "of the one shared cache claim. Applies beyond one per EngineBuild or claim come from deployments "
        "that needed the same new object before the operator's watch showed it; server-side apply makes them "
        "idempotent (extra requests, no duplicate objects).",
        f"- Shared builds: {f['engine_builds']} EngineBuilds and {f['jobs']} Jobs for {count} deployments "
        f"({len(f['deployments_per_engine'])} distinct engines by the builders).",
        f"- Steady state: {steady} requests other than watches in {f['steady_seconds']:.0f} s"
        + (" - status is written only when it changes and resyncs cost nothing." if not steady else "."),
    ]
    process = f.get("operator_process")
    if process is not None:
        parts.append(
            f"- The operator process: at most {process['peak_rss_mib']:.0f} MiB resident, "
            f"{process['cpu_seconds_rollout']:.1f} CPU seconds for the rollout of {count} deployments "
            f"({process['cpu_seconds_rollout'] / count * 1000:.0f} ms each), "
            f"{process['cpu_seconds_steady']:.1f} in the {f['steady_seconds']:.0f} s of steady state."
        )
    parts.append("")
    return "\n".join(parts)


def render(records: Sequence[Record]) -> str:
    record = records[0]
    figures = record["figures"]
    return f"{provenance(record)}\n\n{report(figures)}\n{interpret(figures)}"
