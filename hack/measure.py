"""Time one of the measurements of docs/development.md's "Measured times" and write its record.

python3 hack/measure.py --list              # the measurements (benchmarks/timings.py) and what each runs
python3 hack/measure.py test-warm           # run it: benchmarks/results/timing-test-warm.json, then the table
make measure NAME=test-warm                 # the same

Each step runs under bash with its output passed through (and scanned: phase boundaries, the pytest summary);
its time is the wall clock from start to exit; a measurement of the local cluster also notes which of the
cluster's processes run after each step (from its pid files). A step that fails ends the measurement without
a record. The scratch directory (`{dir}`: cold caches, a fresh clone, a cluster directory) is removed
afterwards. Only the standard library is used, so the cold measurement needs no virtualenv of its own.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Run as `python3 hack/measure.py`, by any Python: the repository's root, where `benchmarks` (its measurements
# and records, the standard library only) lives. Nothing here needs the local-cluster harness.
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import durations, records, timings  # noqa: E402

PENDING_BLOCK = "local-cluster-times"
MAKE_VARIABLES = ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
# pytest's last line, with or without -q: "==== 1066 passed, 3 skipped in 783.21s (0:13:03) ====".
PYTEST_SUMMARY = re.compile(r"^=*\s*(?P<counts>\d+ \w+(?:, \d+ \w+)*) in [\d.]+s(?: \([\d:]+\))?\s*=*$")
PYTEST_COUNT = re.compile(r"(\d+) (\w+)")


class StepFailed(RuntimeError):
    pass


def pytest_counts(line: str) -> dict[str, int] | None:
    """`{"passed": 1066, "skipped": 3}` from pytest's final summary line, None for any other line."""
    match = PYTEST_SUMMARY.match(line.strip())
    if not match:
        return None
    return {outcome: int(n) for n, outcome in PYTEST_COUNT.findall(match.group("counts"))}


def phase_seconds(marks: Mapping[str, float], total: float) -> dict[str, float]:
    """Each phase's duration from the times its first line appeared: until the next phase's start, the last
    one until the end of the step."""
    ordered = sorted(marks.items(), key=lambda kv: kv[1])
    ends = [t for _, t in ordered[1:]] + [total] if ordered else []
    return {label: round(end - start, 1) for (label, start), end in zip(ordered, ends, strict=True)}


def user_environment() -> dict[str, str]:
    """This process's environment without what `make measure` itself adds: a measured `make test` runs as if
    typed (no inherited MAKEFLAGS with NAME=..., MAKELEVEL 0)."""
    return {k: v for k, v in os.environ.items() if k not in MAKE_VARIABLES}


def run_step(
    command: str, cwd: Path, env: Mapping[str, str], phases: Sequence[tuple[str, str]]
) -> dict[str, Any]:
    """Run `command`, pass its output through, and return its time, phases and test counts. A phase whose
    pattern has a group `seconds` takes its time from the line (a part that times itself, as build.sh's
    parallel builds do); any other lasts from its first line to the next phase's."""
    patterns = [(label, re.compile(pattern)) for label, pattern in phases]
    marks: dict[str, float] = {}
    reported: dict[str, float] = {}
    tests: dict[str, int] | None = None
    started = time.monotonic()
    with subprocess.Popen(
        ["bash", "-c", command],
        cwd=cwd,
        env={**user_environment(), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            now = time.monotonic() - started
            for label, pattern in patterns:
                match = pattern.search(line)
                if match is None or label in marks or label in reported:
                    continue
                if "seconds" in pattern.groupindex:
                    reported[label] = float(match["seconds"])
                else:
                    marks[label] = now
            tests = pytest_counts(line) or tests
        returncode = proc.wait()
    seconds = time.monotonic() - started
    if returncode != 0:
        raise StepFailed(f"`{command}` exited with {returncode} after {seconds:.1f} s")
    timed = {**phase_seconds(marks, seconds), **reported}
    return {"seconds": round(seconds, 2), "phases": timed, "tests": tests}


def running_processes(cluster: Path) -> list[str]:
    """The processes of the local cluster in `cluster` that run now: those whose pid file (`<pid>:<start
    time>`, as the harness writes it) names a live process started at that time (not a recycled pid)."""
    names = []
    for pid_file in sorted((cluster / "pids").glob("*.pid")):
        try:
            pid_text, started = pid_file.read_text().split(":", 1)
            stat = Path(f"/proc/{int(pid_text)}/stat").read_text()
        except (OSError, ValueError):
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if fields[0] != "Z" and fields[19] == started.strip():
            names.append(pid_file.stem)
    return names


def go_version() -> str | None:
    try:
        out = subprocess.run(["go", "version"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return out.split()[2] if len(out.split()) > 2 else out.strip()


def fill(text: str, values: Mapping[str, str]) -> str:
    return text.format(**values)


def remove_tree(path: Path) -> None:
    """Remove `path`, including Go's read-only module cache."""
    for root, dirs, _ in os.walk(path):
        for name in dirs:
            Path(root, name).chmod(0o755)
    shutil.rmtree(path, ignore_errors=True)


def measure(m: timings.Measurement, argv: Sequence[str]) -> records.Record:
    scratch = Path(tempfile.mkdtemp(prefix=f"specdeploy-measure-{m.name}-"))
    git = records.git_facts()
    values = {"dir": str(scratch), "repo": str(REPO), "commit": str(git["commit"])}
    env = {k: fill(v, values) for k, v in m.env.items()}
    cwd = Path(fill(m.cwd, values))
    started = records.now()
    go = go_version()
    record = records.new_record(
        timings.record_name(m.name),
        records.command_line(argv),
        started,
        records.machine_facts(**({"go": go} if go else {})),
        {"rounds": m.rounds, "steps": [fill(s.command, values) for s in m.steps], "env": dict(m.env)},
    )
    if m.cwd != "{repo}":  # it runs in a fresh clone of the commit: this checkout's changes are not in it
        record["git"]["dirty"] = False
        record["code"] = {path: records.tree_hash(values["commit"], path) for path in record["code"]}
    rounds: list[list[dict[str, Any]]] = []
    try:
        for command in m.setup:
            subprocess.run(["bash", "-c", fill(command, values)], cwd=REPO, check=True)
        for i in range(m.rounds):
            results: list[dict[str, Any]] = []
            for step in m.steps:
                print(
                    f"[measure] {m.name} round {i + 1}/{m.rounds}: {step.label}", file=sys.stderr, flush=True
                )
                junit = scratch / f"junit-{i}-{len(results)}.xml"
                step_env = {**env, "PYTEST_ARGS": f"--junitxml={junit}"} if m.durations else env
                results.append(run_step(fill(step.command, values), cwd, step_env, m.phases))
                if junit.exists():
                    results[-1]["durations"] = durations.summarize(junit.read_text())
                if m.cluster:
                    results[-1]["processes"] = running_processes(Path(fill(m.cluster, values)))
                print(f"[measure] {results[-1]['seconds']:.1f} s", file=sys.stderr, flush=True)
            rounds.append(results)
    finally:
        for command in m.cleanup:
            subprocess.run(["bash", "-c", fill(command, values)], cwd=REPO, check=False)
        remove_tree(scratch)
    return records.finish(record, started, {"rounds": rounds})


def write(record: records.Record, measurement: str) -> list[Path]:
    """Save `record`, re-render the measured table and drop the hand-typed rows it replaces."""
    records.save(record)
    written = records.update_docs([record["name"]])
    doc = records.DEVELOPMENT_DOC
    text = doc.read_text()
    updated = records.drop_pending_rows(text, PENDING_BLOCK, f"`make measure NAME={measurement}`")
    if updated != text:
        doc.write_text(updated)
    return sorted(set(written) | ({doc} if updated != text else set()))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="hack/measure.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("name", nargs="?", choices=sorted(timings.BY_NAME), help="the measurement")
    parser.add_argument("--list", action="store_true", help="list the measurements")
    parser.add_argument("--no-write", action="store_true", help="print only: no record, docs untouched")
    args = parser.parse_args(argv)
    if args.list or not args.name:
        for m in timings.MEASUREMENTS:
            steps = "; ".join(s.command for s in m.steps)
            print(
                f"{m.name:24} {m.what}\n{'':24} runs: {steps}"
                + (f" ({m.rounds} rounds)" if m.rounds > 1 else "")
            )
        return 0
    measurement = timings.BY_NAME[args.name]
    try:
        # make sets MAKELEVEL for its recipes: name the command as the user typed it.
        invoked = (
            ["make", "measure", f"NAME={args.name}"] if "MAKELEVEL" in os.environ else ["python3", *sys.argv]
        )
        record = measure(measurement, invoked)
    except StepFailed as failure:
        print(f"[measure] {failure}: no record written", file=sys.stderr)
        return 1
    print(timings.render([record]))
    if not args.no_write:
        for path in write(record, args.name):
            print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
