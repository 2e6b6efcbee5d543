"""A record says what it measured (the hash of each path it measured, the processes and build phases it saw)
and the records check holds that to the code as it is now (benchmarks/record_checks.py): a structural
mismatch fails here; measured code that changed since is a report (`python -m benchmarks.records --stale`)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from specdeploy_localcluster.cluster import LocalCluster

from benchmarks import record_checks, records, timings
from benchmarks.measured_paths import measured_paths
from hack import measure

# Records known to describe a structure the code no longer has, each with exactly the problems the check finds
# (record name -> problems), for a record that cannot be measured again at once: the test fails both on a
# record missing here and on one listed here that no longer has these problems. None at present.
EXPECTED_STALE: dict[str, list[str]] = {}


def test_every_record_measured_the_structure_the_code_has_now_but_the_named_stale_ones() -> None:
    found = {r["name"]: p for r in record_checks.all_records() if (p := record_checks.structure_problems(r))}
    assert found == EXPECTED_STALE


def test_every_record_stores_the_hash_of_each_path_it_measures() -> None:
    for record in record_checks.all_records():
        declared = measured_paths(record["name"])
        assert declared, f"{record['name']}: no measured paths declared in benchmarks/measured_paths.py"
        assert set(record["code"]) == set(declared), record["name"]
        assert all(re.fullmatch(r"[0-9a-f]{40}", h or "") for h in record["code"].values()), record["name"]


@pytest.mark.parametrize("name", sorted({n for b in records.blocks() for n in b.records}))
def test_each_record_of_a_block_declares_paths_that_exist(name: str) -> None:
    paths = measured_paths(name)
    assert paths, f"{name}: declare what it measures in benchmarks/measured_paths.py"
    assert [p for p in paths if not (records.REPO / p).exists()] == []


@pytest.mark.parametrize(("autoscaling", "lws"), [(True, True), (True, False), (False, True), (False, False)])
def test_the_cluster_processes_read_from_the_harness_are_those_it_starts(
    tmp_path: Path, autoscaling: bool, lws: bool
) -> None:
    cluster = LocalCluster(tmp_path, autoscaling=autoscaling, lws=lws)
    assert timings.cluster_processes(autoscaling, lws) == cluster.components


def test_the_cluster_measurements_say_how_many_processes_the_harness_starts() -> None:
    for name, autoscaling in (("cluster", True), ("cluster-no-autoscaling", False)):
        m = timings.BY_NAME[name]
        assert m.expected_processes() == timings.cluster_processes(autoscaling)
        assert f"({len(m.expected_processes())} processes)" in m.what


def test_the_build_phases_are_the_builds_of_every_unit_build_sh_makes_and_each_times_itself() -> None:
    script = records.REPO / "hack" / "cluster" / "build.sh"
    listed = subprocess.run([str(script), "--units"], check=True, capture_output=True, text=True)
    units = listed.stdout.split()
    # gomod/addons' units build in one go build, the job `addons`
    jobs = {"addons" if unit in ("kwok-lws", "prometheus", "promtool") else unit for unit in units}
    assert jobs == set(timings.BUILD_UNITS)
    assert re.search(r'log "\$2 built in \$\(\(SECONDS - start\)\)s"', script.read_text())
    for unit, pattern in timings.BUILD_PHASES:
        match = re.search(pattern, f"[build] {unit} built in 42s")
        assert match is not None, unit
        assert match["seconds"] == "42", unit


def _timing(name: str, results: list[dict[str, Any]]) -> records.Record:
    return {"name": f"timing-{name}", "figures": {"rounds": [results]}}


def test_a_timing_record_with_a_phase_gone_or_missing_is_flagged() -> None:
    labels = [label for label, _ in timings.BUILD_PHASES]
    every = dict.fromkeys(labels, 1.0)
    assert record_checks.structure_problems(_timing("build-cold", [{"phases": every}])) == []
    old = {**dict.fromkeys(labels[1:], 1.0), "test-adapter": 1.0}
    assert record_checks.structure_problems(_timing("build-cold", [{"phases": old}])) == [
        "phases benchmarks/timings.py no longer declares: test-adapter",
        f"no time for the declared phases: {labels[0]}",
    ]
    # a warm run skips phases (nothing to build): only phases that are not declared count
    assert record_checks.structure_problems(_timing("test-warm", [{"phases": {"tests": 1.0}}])) == []


def test_a_cluster_timing_that_saw_other_processes_or_none_is_flagged() -> None:
    now = list(timings.cluster_processes(False))
    up, down = {"seconds": 1.0, "processes": now}, {"seconds": 1.0, "processes": []}
    assert record_checks.structure_problems(_timing("cluster-no-autoscaling", [up, up, down])) == []
    fewer = {"seconds": 1.0, "processes": now[:-1]}
    [problem] = record_checks.structure_problems(_timing("cluster-no-autoscaling", [fewer, up, down]))
    assert problem.startswith(f"saw the processes {', '.join(sorted(now[:-1]))};")
    assert record_checks.structure_problems(_timing("cluster", [{"seconds": 1.0}])) == [
        "no processes noted (measured before records noted them)"
    ]


def test_a_memory_record_without_a_row_for_each_cluster_process_is_flagged() -> None:
    processes = timings.cluster_processes(True)
    row = {"VmRSS": 1.0}

    def memory(cluster: dict[str, Any], parameters: dict[str, Any]) -> records.Record:
        return {"name": "memory", "parameters": parameters, "figures": {"cluster": cluster}}

    assert record_checks.structure_problems(memory(dict.fromkeys(processes, row), {})) == []
    without = {name: row for name in processes if name != "prometheus"}
    [problem] = record_checks.structure_problems(memory(without, {}))
    assert "(missing: prometheus; gone: none)" in problem
    off = dict.fromkeys(timings.cluster_processes(False), row)
    assert record_checks.structure_problems(memory(off, {"autoscaling": False})) == []


def test_code_changed_since_a_record_is_reported_path_by_path() -> None:
    paths = measured_paths("timing-cluster")
    current = {p: records.tree_hash("HEAD", p) for p in paths}
    record: records.Record = {"name": "timing-cluster", "code": current}
    assert record_checks.changed_paths(record) == {}
    old = {**current, paths[0]: "0" * 40}
    assert record_checks.changed_paths({**record, "code": old}) == {paths[0]: ("0" * 40, current[paths[0]])}
    assert set(record_checks.changed_paths({"name": "timing-cluster"})) == set(paths)


def test_a_new_record_stores_the_hash_of_what_it_measures() -> None:
    started = records.now()
    record = records.new_record("timing-cluster", "make measure NAME=cluster", started, {}, {})
    assert set(record["code"]) == set(measured_paths("timing-cluster"))
    assert record["code"]["Makefile"] == records.tree_hash("HEAD", "Makefile") or record["git"]["dirty"]


def test_the_processes_of_a_cluster_are_read_from_its_live_pid_files(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    me = os.getpid()
    started = Path(f"/proc/{me}/stat").read_text().rsplit(")", 1)[-1].split()[19]
    (pids / "alive.pid").write_text(f"{me}:{started}")
    (pids / "recycled.pid").write_text(f"{me}:{int(started) + 1}")
    (pids / "gone.pid").write_text("999999999:1")
    (pids / "alive.argv.json").write_text("{}")
    assert measure.running_processes(tmp_path) == ["alive"]


def test_a_cluster_row_says_how_many_processes_ran_after_each_step() -> None:
    now = list(timings.cluster_processes(True))
    up, down = {"seconds": 1.0, "processes": now}, {"seconds": 1.0, "processes": []}
    record = {
        **_timing("cluster", [up, up, down]),
        "started": "2026-11-27T09:00:00Z",
        "machine": {"load_start": 1.0, "load_end": 1.0},
    }
    details = [row[3] for row in timings.rows(record)]
    assert details == [f"{len(now)} processes running after it"] * 2 + ["no process left running"]
