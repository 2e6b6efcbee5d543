"""The blocks of docs/benchmarks-server.md, rendered from the records `python -m benchmarks.server` writes
(benchmarks/results/server-<section>.json; see benchmarks/records.py).

A record holds every run of its section (`--runs N`). With more than one run each numeric column is the
median over the runs of that column, derived columns (efficiency, ratios, tok/s) are computed from those
medians, and the last column lists each run's value of the section's key figure.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from benchmarks.records import GPU_SECTIONS, Record, provenance
from benchmarks.server import assisted as assisted_bench
from benchmarks.server import concurrency as concurrency_bench
from benchmarks.server import gpu_http, gpu_reference, load_sweep_report
from benchmarks.server import http_stream as http_stream_bench
from benchmarks.server import load_sweep as load_sweep_bench
from benchmarks.server import loop_lag as loop_lag_bench
from benchmarks.server import orchestration as orchestration_bench
from benchmarks.server import predicted as predicted_bench
from benchmarks.server import structured as structured_bench

ORCHESTRATION_TARGET = 0.95  # efficiency (nominal)
LOOP_LAG_BOUND_MS = 5.0  # loop-lag p99 in every scenario

Row = Mapping[str, Any]


def _combine(values: Sequence[Any]) -> Any:
    first = values[0]
    if all(v == first for v in values) or first is None or isinstance(first, (str, list)):
        return first
    if isinstance(first, bool):
        return all(values)
    return statistics.median(values)


def median_rows(runs: Sequence[Sequence[Row]]) -> list[dict[str, Any]]:
    """Row i of the result: for each field, the median of row i over the runs (booleans: all of them; text
    and fields equal in every run: as they are; lists: the first run's)."""
    if any(len(run) != len(runs[0]) for run in runs):
        raise ValueError("the runs of a record have different numbers of rows")
    return [{key: _combine([run[i][key] for run in runs]) for key in runs[0][i]} for i in range(len(runs[0]))]


def with_column(table: str, header: str, cells: Sequence[str]) -> str:
    """A Markdown table with one more column on the right."""
    lines = table.split("\n")
    if len(lines) != len(cells) + 2:
        raise ValueError("one cell per row")
    out = [f"{lines[0]} {header} |", f"{lines[1]}---|"]
    out += [f"{line} {cell} |" for line, cell in zip(lines[2:], cells, strict=True)]
    return "\n".join(out)


def _runs(record: Record) -> list[list[dict[str, Any]]]:
    runs: list[list[dict[str, Any]]] = record["figures"]["runs"]
    return runs


def _head(record: Record) -> str:
    n = len(_runs(record))
    how = f"Medians of {n} runs; each run's value in the last column." if n > 1 else "One run."
    return f"{provenance(record)} {how}"


def _each(runs: Sequence[Sequence[Row]], figure: str, fmt: str, build: Any) -> list[str]:
    return [
        " ".join(format(getattr(build(**run[i]), figure), fmt) for run in runs) for i in range(len(runs[0]))
    ]


def orchestration(records: Sequence[Record]) -> str:
    record = records[0]
    runs = _runs(record)
    cls = orchestration_bench.OrchestrationResult
    rows = [cls(**r) for r in median_rows(runs)]
    table = orchestration_bench.table(rows)
    if len(runs) > 1:
        table = with_column(table, "efficiency, each run", _each(runs, "efficiency", ".3f", cls))
    met = sum(r.efficiency >= ORCHESTRATION_TARGET for r in rows)
    runs_below = sum(cls(**row).efficiency < ORCHESTRATION_TARGET for run in runs for row in run)
    return (
        f"{_head(record)}\n\n{table}\n\nTarget: efficiency ≥ {ORCHESTRATION_TARGET}. Met by {met} of "
        f"{len(rows)} rows; {runs_below} of {len(rows) * len(runs)} single measurements fell below it.\n"
    )


def assisted(records: Sequence[Record]) -> str:
    record = records[0]
    runs = _runs(record)
    cls = assisted_bench.AssistedResult
    table = assisted_bench.table([cls(**r) for r in median_rows(runs)])
    if len(runs) > 1:
        table = with_column(table, "tok/s, each run", _each(runs, "tok_s", ".1f", cls))
    return f"{_head(record)}\n\n{table}\n"


def http_stream(records: Sequence[Record]) -> str:
    record = records[0]
    runs = _runs(record)
    cls = http_stream_bench.StreamResult
    table = http_stream_bench.table([cls(**r) for r in median_rows(runs)])
    if len(runs) > 1:
        table = with_column(table, "tokens/s, each run", _each(runs, "tok_s", ".0f", cls))
    return f"{_head(record)}\n\n{table}\n"


def concurrency(records: Sequence[Record]) -> str:
    record = records[0]
    runs = _runs(record)
    cls = concurrency_bench.ConcurrencyResult
    rows = [cls(**r) for r in median_rows(runs)]
    table = concurrency_bench.table(rows)
    if len(runs) > 1:
        ratios = [
            " ".join(f"{cls(**run[i]).tok_s / cls(**run[0]).tok_s:.2f}" for run in runs)
            for i in range(len(rows))
        ]
        table = with_column(table, "vs concurrency 1, each run", ratios)
    identical = all(row["identical"] for run in runs for row in run)
    latencies = " → ".join(f"{r.latency_p50:.2f} s" for r in rows)
    return (
        f"{_head(record)}\n\n{table}\n\nOutputs identical to concurrency 1 in every run: "
        f"{'yes' if identical else 'NO'}. Median latency per request by concurrency: {latencies}.\n"
    )


def loop_lag(records: Sequence[Record]) -> str:
    record = records[0]
    runs = _runs(record)
    cls = loop_lag_bench.LagResult
    rows = [cls(**r) for r in median_rows(runs)]
    table = loop_lag_bench.table(rows)
    if len(runs) > 1:
        table = with_column(table, "p99 (ms), each run", _each(runs, "p99_ms", ".2f", cls))
    held = sum(all(row["p99_ms"] < LOOP_LAG_BOUND_MS for row in run) for run in runs)
    return (
        f"{_head(record)}\n\n{table}\n\nStated bound: loop-lag p99 < {LOOP_LAG_BOUND_MS:g} ms in every "
        f"scenario. It held in {held} of {len(runs)} runs.\n"
    )


def structured(records: Sequence[Record]) -> str:
    record = records[0]
    runs = _runs(record)
    cls = structured_bench.StructuredResult
    table = structured_bench.table([cls(**r) for r in median_rows(runs)])
    if len(runs) > 1:
        table = with_column(table, "tok/s, each run", _each(runs, "tok_s", ".0f", cls))
    identical = all(row["identical"] for run in runs for row in run)
    valid = all(row["valid"] == row["requests"] for run in runs for row in run if row["constrained"])
    return (
        f"{_head(record)}\n\n{table}\n\nEvery method's output identical to method none's: "
        f"{'yes' if identical else 'NO'}; every json_schema output valid against its schema: "
        f"{'yes' if valid else 'NO'}.\n"
    )


def load_sweep(records: Sequence[Record]) -> str:
    record = records[0]
    runs = _runs(record)
    points = [load_sweep_bench.SweepPoint(**r) for r in median_rows(runs)]
    return f"{_head(record)}\n\n{load_sweep_report.render_body(points)}"


def predicted(records: Sequence[Record]) -> str:
    record = records[0]
    runs = _runs(record)
    cls = predicted_bench.PredictedResult
    rows = [cls(**r) for r in median_rows(runs)]
    table = predicted_bench.table(rows)
    if len(runs) > 1:
        table = with_column(table, "speedup, each run", _each(runs, "speedup", ".2f", cls))
    identical = all(row["identical"] for run in runs for row in run)
    return (
        f"{_head(record)}\n\n{table}\n\nTargets: {predicted_bench.verdicts(rows)}. Every output identical to "
        f"the same request's without a prediction: {'yes' if identical else 'NO'}.\n\n"
        f"![speedup against the share of the prediction changed](images/predicted-outputs.png)\n"
    )


# ------------------------------------------------------------------------------ on a GPU (gpu_day.py)

GPU_TABLES: dict[str, tuple[str, Any, Any]] = {  # section -> (title, row class, table)
    "reference-1b": ("Reference backend: plain, k = 4, auto", gpu_reference.GpuPoint, gpu_reference.table),
    "http": ("Server over HTTP vs the engine driven directly", gpu_http.HttpPoint, gpu_http.table),
    "structured": (
        "JSON schema with speculation on and off",
        structured_bench.StructuredResult,
        structured_bench.table,
    ),
    "assisted": (
        "transformers' assisted generation vs ours, batch 1",
        assisted_bench.AssistedResult,
        assisted_bench.table,
    ),
    "reference-8b": ("Reference backend: plain, k = 4, auto", gpu_reference.GpuPoint, gpu_reference.table),
}
GPU_RECORD_PREFIX = "server-gpu-"
assert set(GPU_TABLES) == set(GPU_SECTIONS)


def gpu_section(record: Record) -> str:
    """One GPU section's record: its title, provenance and table."""
    title, cls, build = GPU_TABLES[record["name"].removeprefix(GPU_RECORD_PREFIX)]
    rows = [cls(**r) for r in median_rows(_runs(record))]
    shape = record["parameters"].get("shape")
    clock = record["figures"].get("gpu_clock")
    sampled = (
        f" GPU SM clock during the section: {clock['sm_mhz_min']}-{clock['sm_mhz_max']} MHz (median "
        f"{clock['sm_mhz_median']:g}), utilisation median {clock['utilisation_median_percent']:g} %."
        if clock
        else ""
    )
    return f"#### {title} ({shape} shapes)\n\n{_head(record)}{sampled}\n\n{build(rows)}\n"


def gpu(records: Sequence[Record]) -> str:
    """Every GPU section that has a record, in the order they run."""
    if not records:
        return "No GPU figures yet: `bash benchmarks/gpu_day.sh` on a machine with a GPU writes them.\n"
    order = list(GPU_SECTIONS)
    ranked = sorted(records, key=lambda r: order.index(r["name"].removeprefix(GPU_RECORD_PREFIX)))
    return "\n".join(gpu_section(r) for r in ranked)
