"""Run the server benchmarks: each section writes its record, benchmarks/results/server-<section>.json, and
its block of docs/benchmarks-server.md is rendered from that record (benchmarks/records.py).

python -m benchmarks.server                 # all eight, one run each (about 17 minutes on 2 CPU cores)
python -m benchmarks.server --only 7        # the load sweep (stand-ins + reference backend; ~14 minutes)
python -m benchmarks.server --only 8        # predicted outputs (demo models, reference backend; ~3 minutes)
python -m benchmarks.server --runs 3        # three runs of each: medians, and each run's key figure
python -m benchmarks.server --only 1,3      # a subset
python -m benchmarks.server --quick         # shorter runs, for a smoke check (records say --quick)
python -m benchmarks.server --no-write      # print only: no record, docs untouched
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from benchmarks import records

ALL = "1,2,3,4,5,6,7,8"


@dataclass(frozen=True)
class Section:
    number: int
    name: str  # the record is server-<name>, rendered by benchmarks.server.render.<name with _>
    title: str
    run: Callable[[bool], Sequence[Any]]  # quick -> result dataclasses
    parameters: Callable[[bool], dict[str, Any]]
    #: run after the record is saved (the load sweep writes its plot from the record)
    after: Callable[[records.Record], None] | None = None


def _orchestration(quick: bool) -> Sequence[Any]:
    from benchmarks.server import orchestration  # noqa: PLC0415

    return orchestration.run(seconds=1.5 if quick else 4.0)


def _assisted(quick: bool) -> Sequence[Any]:
    from benchmarks.server import assisted  # noqa: PLC0415

    return assisted.run(prompts=4 if quick else 8, max_new=32 if quick else 64)


def _http_stream(quick: bool) -> Sequence[Any]:
    from benchmarks.server import http_stream  # noqa: PLC0415

    return http_stream.run(
        ((8, 500), (64, 125)) if quick else ((8, 2000), (64, 500)), rounds=2 if quick else 6
    )


def _concurrency(quick: bool) -> Sequence[Any]:
    from benchmarks.server import concurrency  # noqa: PLC0415

    return concurrency.run(requests=4 if quick else 8, max_new=32 if quick else 64)


def _loop_lag(quick: bool) -> Sequence[Any]:
    from benchmarks.server import loop_lag  # noqa: PLC0415

    return loop_lag.run(requests=300 if quick else 1000, seconds=2.0 if quick else 5.0)


def _structured(quick: bool) -> Sequence[Any]:
    from benchmarks.server import structured  # noqa: PLC0415

    return structured.run(requests=4 if quick else 12)


def _load_sweep(quick: bool) -> Sequence[Any]:
    from benchmarks.server import load_sweep  # noqa: PLC0415

    return load_sweep.run(quick=quick)


def _predicted(quick: bool) -> Sequence[Any]:
    from benchmarks.server import predicted  # noqa: PLC0415

    return predicted.run(max_new=24 if quick else 48)


def _predicted_plot(record: records.Record) -> None:
    from benchmarks.server import predicted  # noqa: PLC0415
    from benchmarks.server.render import median_rows  # noqa: PLC0415

    rows = [predicted.PredictedResult(**r) for r in median_rows(record["figures"]["runs"])]
    predicted.plot(rows, records.REPO / predicted.PLOT)


def _load_sweep_parameters(quick: bool) -> dict[str, Any]:
    from benchmarks.server import load_sweep  # noqa: PLC0415

    return {
        "time_scale": load_sweep.TIME_SCALE,
        "request_tokens": load_sweep.REQUEST_TOKENS,
        "standin_levels": list(load_sweep.STANDIN_LEVELS),
        "reference_levels": list(load_sweep.REFERENCE_LEVELS),
        "fixed": list(load_sweep.FIXED),
    }


def _load_sweep_plot(record: records.Record) -> None:
    from benchmarks.server import load_sweep, load_sweep_report  # noqa: PLC0415
    from benchmarks.server.render import median_rows  # noqa: PLC0415

    points = [load_sweep.SweepPoint(**r) for r in median_rows(record["figures"]["runs"])]
    load_sweep_report.plot(points, records.REPO / load_sweep_report.PLOT)


SECTIONS = (
    Section(
        1,
        "orchestration",
        "Orchestration efficiency (stand-in executors)",
        _orchestration,
        lambda q: {"seconds": 1.5 if q else 4.0},
    ),
    Section(
        2,
        "assisted",
        "Reference backend vs transformers assisted generation (CPU)",
        _assisted,
        lambda q: {"prompts": 4 if q else 8, "max_new": 32 if q else 64, "draft_len": 4},
    ),
    Section(
        3,
        "http-stream",
        "HTTP streaming throughput (instant engine)",
        _http_stream,
        lambda q: {
            "streams_tokens": [[8, 500], [64, 125]] if q else [[8, 2000], [64, 500]],
            "tokens_per_step": 4,
            "rounds": 2 if q else 6,
        },
    ),
    Section(
        4,
        "concurrency",
        "Reference backend under concurrency (CPU)",
        _concurrency,
        lambda q: {"requests": 4 if q else 8, "max_new": 32 if q else 64, "draft_len": 4},
    ),
    Section(
        5,
        "loop-lag",
        "Event-loop lag under HTTP work (stand-in executors)",
        _loop_lag,
        lambda q: {"requests": 300 if q else 1000, "seconds": 2.0 if q else 5.0},
    ),
    Section(
        6,
        "structured",
        "Constrained generation with speculation vs without (CPU)",
        _structured,
        lambda q: {"requests": 4 if q else 12, "max_new": 200, "draft_len": 4},
    ),
    Section(
        7,
        "load-sweep",
        "Speculation under load: fixed draft lengths vs draftLen auto",
        _load_sweep,
        _load_sweep_parameters,
        _load_sweep_plot,
    ),
    Section(
        8,
        "predicted",
        "Predicted outputs: a prediction of the output vs none (CPU)",
        _predicted,
        lambda q: {
            "max_new": 24 if q else 48,
            "prompts": 8,
            "edits": [0.0, 0.02, 0.10, 0.50],
            "concurrency": [1, 8],
            "train_steps": 60,
        },
        _predicted_plot,
    ),
)


def versions() -> dict[str, str]:
    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    return {"torch": torch.__version__, "transformers": transformers.__version__}


def measure(section: Section, runs: int, quick: bool, command: str) -> records.Record:
    started = records.now()
    record = records.new_record(
        f"server-{section.name}",
        command,
        started,
        records.machine_facts(**versions()),
        {"runs": runs, "quick": quick, **section.parameters(quick)},
    )
    all_runs = []
    for i in range(runs):
        print(f"{section.number}. {section.title}: run {i + 1} of {runs} ...", flush=True)
        all_runs.append([dataclasses.asdict(r) for r in section.run(quick)])
    return records.finish(record, started, {"runs": all_runs})


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.server", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--only", default=ALL, help="comma-separated benchmark numbers")
    parser.add_argument("--runs", type=int, default=1, help="runs of each section (medians over them)")
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--no-write", action="store_true", help="print only: no record, docs untouched")
    args = parser.parse_args(argv)
    only = {int(x) for x in args.only.split(",") if x}
    command = records.command_line(["python", "-m", "benchmarks.server", *argv])
    from benchmarks.server import render  # noqa: PLC0415

    for section in SECTIONS:
        if section.number not in only:
            continue
        record = measure(section, args.runs, args.quick, command)
        print(f"## {section.number}. {section.title}\n", flush=True)
        print(getattr(render, section.name.replace("-", "_"))([record]), flush=True)
        if not args.no_write:
            path = records.save(record)
            if section.after is not None:
                section.after(record)
            docs = records.update_docs([record["name"]])
            print(
                f"wrote {path.relative_to(records.REPO)}; {', '.join(str(d) for d in docs) or 'docs current'}"
            )


if __name__ == "__main__":
    main()
