"""The autoscaling block of docs/benchmarks.md, rendered from the record `python -m benchmarks.autoscaling`
writes (benchmarks/results/autoscaling.json; see benchmarks/records.py)."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.records import Record, provenance

PHASES = {
    "metric": "metric (load started -> the adapter serves queue depth above target)",
    "hpa": "HPA reaction (-> replicas raised)",
    "node": "node provisioning (-> the new node exists)",
    "pod": "pod start (-> new replica Ready: the real server loaded its models)",
    "serving": "serving (-> a request completed through the new replica)",
    "up": "metric above target -> new replica serving",
    "down": "scale-down (load stopped -> one replica)",
    "node_gone": "node removal (-> emptied node deleted)",
}


def median(rounds: Sequence[Mapping[str, Any]], path: str, phase: str) -> float:
    values = [float(r["seconds"][phase]) for r in rounds if r["path"] == path]
    return statistics.median(values) if values else float("nan")


def render(records: Sequence[Record]) -> str:
    record = records[0]
    rounds: list[dict[str, Any]] = record["figures"]["rounds"]
    rows = [
        "| Step (seconds since the load started or stopped, median) "
        "| Reference (Deployment + HPA) | Operator | Ratio |",
        "|---|---:|---:|---:|",
    ]
    for phase, label in PHASES.items():
        ref, op = median(rounds, "reference", phase), median(rounds, "operator", phase)
        rows.append(f"| {label} | {ref:.1f} | {op:.1f} | {op / ref:.2f}x |")
    n = sum(1 for r in rounds if r["path"] == "operator")
    up_ref, up_op = median(rounds, "reference", "up"), median(rounds, "operator", "up")
    return (
        f"{provenance(record)}\n\n"
        f"{n} rounds per path, real load (8 streaming clients) on real servers (`backend: transformers`, "
        "1-CPU nodes of the `cpu-autoscaled` pool, one replica each); the signal goes servers -> Prometheus "
        "(2 s scrape) -> prometheus-adapter (4 s relist) -> HPA. Local timers: HPA sync 5 s, Cluster "
        "Autoscaler scan 2 s, unneeded time 10 s; scale-down stabilization window 10 s"
        " (the default is 600 s)."
        "\n\n" + "\n".join(rows) + "\n\n"
        "From the metric crossing its target to the new replica serving the operator path takes "
        f"{up_op:.1f} s "
        f"against {up_ref:.1f} s for a Deployment scaled directly by an HPA (**{up_op / up_ref:.2f}x**). "
        "Node provisioning is simulated (kwok makes a node Ready at once), so on a real cluster the minutes "
        "a GPU node takes to boot dominate both paths equally.\n"
    )
