"""Whether a record still measures what the code is now.

- Structure (`structure_problems`): what a record saw must be what the code would make it see today: a timing
  record's phases are those benchmarks/timings.py declares for its measurement (all of them for a cold one,
  where every phase runs), a measurement of the local cluster saw the processes the harness starts now, and
  the memory record has a row for each of them. A mismatch means the record describes something that no
  longer exists: the records test fails on it, and the record is to be measured again.
- Code (`changed_paths`): the hash of each path the record measured (measured_paths.py) against the same
  path at HEAD. Code changes every day, so this is a report (`python -m benchmarks.records --stale`), not a
  failure: it says which records a change may have made stale.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from benchmarks import timings
from benchmarks.measured_paths import measured_paths
from benchmarks.recording import REPO, RESULTS, Record, load, tree_hash


def _names(values: Iterable[str]) -> str:
    return ", ".join(sorted(values)) or "none"


def _timing_problems(record: Record, m: timings.Measurement) -> list[str]:
    problems = []
    results: list[Mapping[str, Any]] = [r for rnd in record["figures"]["rounds"] for r in rnd]
    if m.phases:
        declared = {label for label, _ in m.phases}
        seen = {label for r in results for label in (r.get("phases") or {})}
        if seen - declared:
            problems.append(f"phases benchmarks/timings.py no longer declares: {_names(seen - declared)}")
        if m.cold and declared - seen:
            problems.append(f"no time for the declared phases: {_names(declared - seen)}")
    if m.cluster:
        expected = set(m.expected_processes())
        observed = [r["processes"] for r in results if "processes" in r]
        if not observed:
            problems.append("no processes noted (measured before records noted them)")
        for seen_processes in {tuple(p) for p in observed if p}:
            if set(seen_processes) != expected:
                problems.append(
                    f"saw the processes {_names(seen_processes)}; the cluster runs {_names(expected)} now"
                )
    return problems


def _memory_problems(record: Record) -> list[str]:
    parameters = record.get("parameters") or {}
    autoscaling, lws = bool(parameters.get("autoscaling", True)), bool(parameters.get("lws", True))
    expected = set(timings.cluster_processes(autoscaling, lws))
    seen = set(record["figures"]["cluster"])
    if seen == expected:
        return []
    return [
        f"cluster processes measured: {_names(seen)}; the cluster runs {_names(expected)} now "
        f"(missing: {_names(expected - seen)}; gone: {_names(seen - expected)})"
    ]


def structure_problems(record: Record) -> list[str]:
    """What in `record` no longer matches the structure of the code (empty when it all does)."""
    name = str(record["name"])
    if name.startswith("timing-"):
        m = timings.BY_NAME.get(name.removeprefix("timing-"))
        return _timing_problems(record, m) if m else [f"no measurement {name.removeprefix('timing-')!r}"]
    if name == "memory":
        return _memory_problems(record)
    return []


def changed_paths(record: Record, revision: str = "HEAD") -> dict[str, tuple[str | None, str | None]]:
    """Each measured path whose hash in `revision` differs from the one the record stored: (recorded, now).
    A path declared for the record but not stored in it counts as changed (recorded None)."""
    stored: Mapping[str, str | None] = record.get("code") or {}
    paths = list(stored) + [p for p in measured_paths(str(record["name"])) if p not in stored]
    changed = {}
    for path in paths:
        now = tree_hash(revision, path, REPO)
        if stored.get(path) != now:
            changed[path] = (stored.get(path), now)
    return changed


def all_records(names: Iterable[str] | None = None) -> list[Record]:
    wanted = sorted(p.stem for p in RESULTS.glob("*.json")) if names is None else list(names)
    return [r for r in (load(name) for name in wanted) if r is not None]


def stale_report(revision: str = "HEAD") -> list[str]:
    """One line per record that may be stale: its structure no longer matches the code, or code it measured
    changed since it was taken."""
    lines = []
    for record in all_records():
        commit = (record["git"].get("commit") or "unknown commit")[:10]
        where = f"{record['name']} (measured {record['started'][:10]} at {commit})"
        for problem in structure_problems(record):
            lines.append(f"{where}: structure: {problem}")
        changed = changed_paths(record, revision)
        if changed:
            lines.append(f"{where}: code changed since: {', '.join(changed)}")
    return lines
