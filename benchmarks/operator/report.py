"""The operator benchmark's blocks of docs/benchmarks.md, rendered from the records that
`python -m benchmarks.operator [--count 1000]` writes (benchmarks/results/operator.json, operator-1000.json;
see benchmarks/records.py). The record's figures are what `benchmarks.operator.figures.figures` keeps of a
run: counts and times, no raw audit log. How each figure is taken (the clocks, the audit log, /proc) is said
once, in the prose of docs/benchmarks.md, not in every block."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.records import Record, provenance

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
        f"Polled every {f.get('poll_seconds', 0.5):g} s; the reference namespace was deleted in "
        f"{f['reference_cleanup_seconds']:.0f} s before the operator started.",
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
    ]
    if f["log_problems"]:
        lines += ["### Operator log", ""]
        lines += [f"- {n} x {msg}" for msg, n in f["log_problems"]]
        lines += ["", "First lines:", "", "```", *f["log_lines"], "```", ""]
    else:
        lines += ["No warning or error in the operator's log.", ""]
    return "\n".join(lines)


def render(records: Sequence[Record]) -> str:
    record = records[0]
    figures = record["figures"]
    return f"{provenance(record)}\n\n{report(figures)}"
