"""Where the suite's time goes: each test's time, read from the JUnit XML of a measured pytest run
(`make measure NAME=test-warm` has `make test` write one), summed by directory and ranked, kept in the timing
record and rendered into docs/development.md.

A test's time is pytest's: setup, call and teardown together, so a session fixture (the local cluster a
worker starts) counts in the first test that needs it. Under pytest-xdist the workers' times add up to more
than the wall clock. The standard library only, like hack/measure.py that calls it.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any

from benchmarks.recording import Record, provenance

SLOWEST = 30
"""How many of the slowest tests a record keeps and the docs show."""


def node_id(classname: str, name: str) -> tuple[str, str]:
    """(pytest node id, directory) of a JUnit test case: `tests.unit.test_x` and `test_y` give
    `tests/unit/test_x.py::test_y` and `tests/unit`; a class between module and test stays in the id."""
    parts = classname.split(".")
    module = next((i for i, part in enumerate(parts) if part.startswith("test_")), len(parts) - 1)
    path = "/".join(parts[: module + 1]) + ".py"
    return "::".join([path, *parts[module + 1 :], name]), "/".join(parts[:module])


def summarize(junit: str, slowest: int = SLOWEST) -> dict[str, Any]:
    """`{"tests", "seconds", "directories": {dir: {"tests", "seconds"}}, "slowest": [[node id, seconds]]}`
    from a JUnit XML report."""
    directories: dict[str, dict[str, float]] = {}
    times: list[tuple[float, str]] = []
    for case in ET.fromstring(junit).iter("testcase"):
        test, directory = node_id(case.get("classname", ""), case.get("name", ""))
        seconds = float(case.get("time") or 0.0)
        times.append((seconds, test))
        totals = directories.setdefault(directory, {"tests": 0, "seconds": 0.0})
        totals["tests"] += 1
        totals["seconds"] += seconds
    times.sort(key=lambda item: (-item[0], item[1]))
    return {
        "tests": len(times),
        "seconds": round(sum(s for s, _ in times), 1),
        "directories": {
            d: {"tests": int(t["tests"]), "seconds": round(t["seconds"], 1)}
            for d, t in sorted(directories.items())
        },
        "slowest": [[test, round(seconds, 1)] for seconds, test in times[:slowest]],
    }


def _summary(record: Record) -> tuple[dict[str, Any], float] | None:
    """The durations of the record's first pytest run and that run's wall time (None: it kept none)."""
    for rnd in record["figures"]["rounds"]:
        for result in rnd:
            if result.get("durations"):
                return result["durations"], float(result["seconds"])
    return None


def render(records: Sequence[Record]) -> str:
    """The directories' totals and the slowest tests of the measured `make test`."""
    (record,) = records
    found = _summary(record)
    if found is None:
        note = f"The record predates per-test durations; `{record['command']}` keeps them."
        return f"{note}\n\n- {provenance(record)}\n"
    summary, wall = found
    minutes = int(wall // 60)
    lines = [
        f"{summary['tests']} tests, {summary['seconds'] / 60:.1f} min of test time over the workers, "
        f"{minutes} min {round(wall - 60 * minutes)} s of wall time for the whole `make test`.",
        "",
        "| directory | tests | time |",
        "|---|---:|---:|",
    ]
    by_time = sorted(summary["directories"].items(), key=lambda item: -item[1]["seconds"])
    lines += [f"| `{d}` | {t['tests']} | {t['seconds']:.0f} s |" for d, t in by_time]
    lines += ["", f"| the {len(summary['slowest'])} slowest tests | time |", "|---|---:|"]
    lines += [f"| `{test}` | {seconds:.1f} s |" for test, seconds in summary["slowest"]]
    lines += ["", f"- {provenance(record)}"]
    return "\n".join(lines) + "\n"
