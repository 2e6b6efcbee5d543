"""The timings of docs/development.md's "Measured times": what `make measure NAME=<name>` (hack/measure.py)
runs for each, and the table rendered from their records (benchmarks/results/timing-<name>.json).

A measurement runs its steps in a scratch directory's context (`{dir}`), `rounds` times, each step timed by
its wall clock; `phases` split a step's time at the first output line matching each pattern (make echoes
each recipe line, build.sh logs each binary it starts); a pytest summary line in the output is kept as the
step's test counts. A measurement of the local cluster also notes, after each step, which of the cluster's
processes run (`Measurement.cluster`); what the cluster should run is read from the harness's sources
(`cluster_processes`), so the labels and the records check (records.structure_problems) follow the code.
Nothing is measured here: this module only says what to run and renders what ran.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.recording import REPO, Record, provenance

#: where the harness lists the processes of a local cluster, in start order (read, not imported: this module
#: runs under any Python, without the harness's dependencies)
CLUSTER_STARTUP = REPO / "hack" / "cluster" / "src" / "specdeploy_localcluster" / "startup.py"


def _startup_tuples(path: Path = CLUSTER_STARTUP) -> dict[str, tuple[str, ...]]:
    """The module-level tuples of strings that `path` assigns, by name."""
    found: dict[str, tuple[str, ...]] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                continue
            if isinstance(value, tuple) and all(isinstance(v, str) for v in value):
                found[node.targets[0].id] = value
    return found


def cluster_processes(
    autoscaling: bool, lws: bool = True, startup: Path = CLUSTER_STARTUP
) -> tuple[str, ...]:
    """The processes a local cluster runs, in start order, as LocalCluster.components lists them: the control
    plane and node agents, the LeaderWorkerSet controller unless `lws` is off, the metrics stack and the
    Cluster Autoscaler unless `autoscaling` is off."""
    tuples = _startup_tuples(startup)
    try:
        return (
            tuples["COMPONENTS"]
            + (tuples["LWS_COMPONENTS"] if lws else ())
            + (tuples["AUTOSCALING_COMPONENTS"] if autoscaling else ())
        )
    except KeyError as missing:
        raise ValueError(f"{startup} assigns no tuple {missing}") from None


# Empty Go caches and binary cache under the scratch directory: a cold build.
COLD_CACHES = {
    "GOCACHE": "{dir}/gocache",
    "GOMODCACHE": "{dir}/gomodcache",
    "SPECDEPLOY_CACHE": "{dir}/specdeploy-cache",
}
# One phase per unit hack/cluster/build.sh builds (two at a time), timed by the unit itself: its
# "[build] <unit> built in <N>s" line. promtool is built with the addons when both are missing (a cold build).
# A unit test holds them to the script.
BUILD_UNITS = ("k8s", "addons", "cluster-autoscaler", "prometheus-adapter", "etcd", "keda-crds")
BUILD_PHASES = tuple((unit, rf"^\[build\] {unit} built in (?P<seconds>\d+)s$") for unit in BUILD_UNITS)
# The units `make demo` builds (build.sh core: no autoscaling chain).
DEMO_BUILD_PHASES = tuple((u, pattern) for u, pattern in BUILD_PHASES if u in ("k8s", "addons", "etcd"))
MAKE_TEST_PHASES = (
    ("venv", r"-m venv |-m pip install"),
    ("binaries", r"^\[build\] "),
    ("lint", r"/ruff check "),
    ("tests", r"-m pytest"),
)


@dataclass(frozen=True)
class Step:
    label: str  # the row's label in the docs
    command: str  # bash, run in `Measurement.cwd`; {dir} {repo} {commit} are filled in


@dataclass(frozen=True)
class Measurement:
    name: str
    what: str
    steps: tuple[Step, ...]
    rounds: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    setup: tuple[str, ...] = ()  # untimed, before the first round
    cleanup: tuple[str, ...] = ()  # untimed, after the last round (also after a failure)
    phases: tuple[tuple[str, str], ...] = ()
    cwd: str = "{repo}"
    cold: bool = False  # empty caches: every phase runs, so a record has them all
    # the local cluster's directory: its running processes are noted after each step; `autoscaling` says
    # whether that cluster runs the metrics stack and the Cluster Autoscaler
    cluster: str | None = None
    autoscaling: bool = True
    # a `make test`: pytest writes a JUnit XML report, whose per-test times (durations.py) the record keeps
    durations: bool = False

    def expected_processes(self) -> tuple[str, ...]:
        """The processes the cluster of this measurement runs once up (none when it measures no cluster)."""
        return cluster_processes(self.autoscaling) if self.cluster else ()


def _cluster(name: str, what: str, make_args: str, autoscaling: bool) -> Measurement:
    cluster = f"CLUSTER_DIR={{dir}}/cluster{make_args}"
    return Measurement(
        name,
        f"{what} ({len(cluster_processes(autoscaling))} processes)",
        (
            Step("`make cluster-up` from stopped", f"make cluster-up {cluster}"),
            Step("`make cluster-up` on a running cluster", f"make cluster-up {cluster}"),
            Step("`make cluster-down`", f"make cluster-down {cluster}"),
        ),
        rounds=3,
        cleanup=(f"make cluster-down {cluster}",),
        cluster="{dir}/cluster",
        autoscaling=autoscaling,
    )


MEASUREMENTS: tuple[Measurement, ...] = (
    Measurement(
        "build-cold",
        "cold build of every binary (empty GOCACHE, GOMODCACHE and binary cache)",
        (Step("`hack/cluster/build.sh`", "hack/cluster/build.sh"),),
        env=COLD_CACHES,
        phases=BUILD_PHASES,
        cold=True,
    ),
    Measurement(
        "build-warm",
        "warm `hack/cluster/build.sh` (cache hit)",
        (Step("`hack/cluster/build.sh`", "hack/cluster/build.sh"),),
        rounds=3,
    ),
    _cluster("cluster", "the local cluster with the metrics stack and the Cluster Autoscaler", "", True),
    _cluster("cluster-no-autoscaling", "the local cluster with `AUTOSCALING=0`", " AUTOSCALING=0", False),
    Measurement(
        "test-server",
        "`tests/server` (the server with tiny real models, no cluster)",
        (Step("pytest", ".venv/bin/python -m pytest -q tests/server"),),
    ),
    Measurement(
        "test-cluster",
        "`tests/integration/test_cluster.py` (its own cluster)",
        (Step("pytest", ".venv/bin/python -m pytest -q tests/integration/test_cluster.py"),),
    ),
    Measurement(
        "test-real-pods",
        "`tests/integration/test_real_pods.py` (examples/09 served for real, rolling update and deletion "
        "under load)",
        (Step("pytest", ".venv/bin/python -m pytest -q tests/integration/test_real_pods.py"),),
    ),
    Measurement(
        "demo",
        "`make demo` on a warm cache (cluster up, examples/01 simulated, the model Job, examples/09 served "
        "for real, the client)",
        (Step("`make demo`", "make demo CLUSTER_DIR={dir}/cluster"),),
        cleanup=("make cluster-down CLUSTER_DIR={dir}/cluster",),
    ),
    Measurement(
        "demo-cold",
        "`make demo` on a fresh clone with empty Go, binary and pip caches: a newcomer's first run",
        (Step("`make demo`", "make demo CLUSTER_DIR={dir}/cluster"),),
        env={**COLD_CACHES, "PIP_NO_CACHE_DIR": "1"},
        setup=(
            "git clone --quiet --no-checkout {repo} {dir}/clone",
            "git -C {dir}/clone checkout --quiet {commit}",
        ),
        cleanup=("make -C {dir}/clone cluster-down CLUSTER_DIR={dir}/cluster",),
        phases=DEMO_BUILD_PHASES,
        cwd="{dir}/clone",
        cold=True,
    ),
    Measurement(
        "test-warm",
        "warm `make test` (binaries cached, venv current; its workers' own clusters)",
        (Step("`make test`", "make test"),),
        phases=MAKE_TEST_PHASES,
        durations=True,
    ),
    Measurement(
        "test-loaded",
        "warm `make test` three times in a row beside a busy loop on one core (each run must pass)",
        (Step("`make test`", "make test"),),
        rounds=3,
        setup=("bash -c 'while :; do :; done' >/dev/null 2>&1 & echo $! > {dir}/busy.pid",),
        cleanup=("kill $(cat {dir}/busy.pid)",),
        phases=MAKE_TEST_PHASES,
    ),
    Measurement(
        "ci-cold",
        "`bash .ci/run` (= `make test`) on a fresh clone of the commit with empty Go caches, an empty binary "
        "cache and pip's cache off",
        (Step("`bash .ci/run`", "bash .ci/run"),),
        env={**COLD_CACHES, "PIP_NO_CACHE_DIR": "1"},
        setup=(
            "git clone --quiet --no-checkout {repo} {dir}/clone",
            "git -C {dir}/clone checkout --quiet {commit}",
        ),
        phases=MAKE_TEST_PHASES,
        cwd="{dir}/clone",
        cold=True,
    ),
)
BY_NAME = {m.name: m for m in MEASUREMENTS}


def record_name(measurement: str) -> str:
    return f"timing-{measurement}"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s"


def span(values: Sequence[float]) -> str:
    if len(values) == 1:
        return duration(values[0])
    low, high = min(values), max(values)
    return f"{duration(low)} to {duration(high)} ({len(values)} runs)"


def _details(results: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    phases: Mapping[str, float] = results[0].get("phases") or {}
    if phases and len(results) == 1:
        parts.append(", ".join(f"{label} {duration(s)}" for label, s in phases.items()))
    if "processes" in results[0]:
        counts = sorted({len(r["processes"]) for r in results})
        running = " or ".join(str(n) for n in counts)
        parts.append(f"{running} processes running after it" if counts != [0] else "no process left running")
    tests = results[0].get("tests")
    if tests:
        parts.append(", ".join(f"{n} {outcome}" for outcome, n in tests.items()))
    return "; ".join(parts)


def rows(record: Record, measurement: Measurement | None = None) -> list[list[str]]:
    """One row per step of the record's measurement (by default the one its name says): what, command, time,
    details, when."""
    measurement = measurement or BY_NAME.get(str(record["name"]).removeprefix("timing-"))
    if measurement is None:
        raise ValueError(f"no measurement for the record {record['name']!r}")
    rounds: list[list[dict[str, Any]]] = record["figures"]["rounds"]
    out = []
    for i, step in enumerate(measurement.steps):
        results = [r[i] for r in rounds]
        what = measurement.what if len(measurement.steps) == 1 else f"{measurement.what}: {step.label}"
        out.append(
            [
                what,
                f"`make measure NAME={measurement.name}`",
                span([r["seconds"] for r in results]),
                _details(results),
                f"{record['started'][:10]}, load {record['machine']['load_start']:.1f} → "
                f"{record['machine'].get('load_end', float('nan')):.1f}",
            ]
        )
    return out


def render_first_run(records: Sequence[Record]) -> str:
    """The README's first-run figure: the cold `make demo`."""
    (record,) = records
    (step,) = record["figures"]["rounds"][0]
    took = duration(step["seconds"])
    return (
        f"Measured: a first `make demo` on an empty machine (a fresh clone; no Go, binary or pip cache) took "
        f"**{took}** on {record['machine']['cpu_cores']} cores, {record['started'][:10]} "
        f"(`{record['command']}`, [docs/development.md](docs/development.md#measured-times)).\n"
    )


def render(records: Sequence[Record]) -> str:
    if not records:
        return (
            "No timing is recorded yet: run `make measure NAME=<name>` (`python3 hack/measure.py --list`).\n"
        )
    lines = [
        "| what | command | time | details | measured (1-min load, start → end) |",
        "|---|---|---|---|---|",
    ]
    lines += [
        "| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for r in records for row in rows(r)
    ]
    notes = [f"- `{r['name']}`: {provenance(r)}" for r in records]
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"
