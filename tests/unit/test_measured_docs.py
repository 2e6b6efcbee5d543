"""Measured figures in the docs come from the command that measures them: every block of docs/benchmarks*.md
and docs/local-cluster.md's measured times is the rendering of its records in benchmarks/results/ (or, until
the command has written one, a PENDING block that says which command replaces it), and no measured table
of those docs lies outside a block (benchmarks/records.py)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from specdeploy_localcluster.nodepools import GpuSpec, NodePool

from benchmarks import autoscaling_report, records, timings
from benchmarks.operator import report as operator_report
from benchmarks.operator.accounting import AuditEntry, ProcessUsage
from benchmarks.operator.cluster import Rollout
from benchmarks.operator.figures import figures as operator_figures
from benchmarks.operator.run import Results
from benchmarks.operator.workload import Plan
from benchmarks.server import render as server_render
from hack import measure

BY_HAND = "by hand; no command measures it yet"


def blocks_of(doc: Path) -> list[tuple[str, str, str]]:
    return records.find_blocks(doc.read_text())


def test_every_measured_block_is_the_rendering_of_its_records() -> None:
    assert records.stale_blocks() == [], (
        "a measured block differs from its records: `python -m benchmarks.records`"
    )


@pytest.mark.parametrize("block", records.blocks(), ids=lambda b: b.name)
def test_each_block_is_measured_from_its_record_or_pending_with_its_command(block: records.Block) -> None:
    found = {(kind, name): body for kind, name, body in blocks_of(block.doc) if name == block.name}
    recorded = [n for n in block.records if records.load(n) is not None]
    if block.partial:
        assert ("MEASURED", block.name) in found, f"{block.doc.name} has no MEASURED {block.name} block"
        return
    if recorded:
        assert ("MEASURED", block.name) in found
        assert ("PENDING", block.name) not in found, f"{block.name} has its record: drop the hand-typed block"
    else:
        assert ("MEASURED", block.name) not in found, f"MEASURED {block.name} without a record"
        assert records.pending_note(block.command) in found[("PENDING", block.name)]


def test_docs_hold_no_block_the_registry_does_not_know() -> None:
    known = {(b.doc, b.name) for b in records.blocks()}
    for doc in records.MEASURED_REGIONS:
        for _, name, _ in blocks_of(doc):
            assert (doc, name) in known, f"{doc.name}: unknown block {name!r}"


def test_every_record_belongs_to_a_block_and_says_where_it_came_from() -> None:
    by_record = {name: block for block in records.blocks() for name in block.records}
    for path in sorted(records.RESULTS.glob("*.json")):
        record = json.loads(path.read_text())
        assert record["name"] == path.stem
        block = by_record.get(path.stem)
        assert block is not None, f"{path.name} is rendered by no block"
        programs: tuple[str, ...]
        if path.stem.startswith("timing-"):  # make measure NAME=<name>, or hack/measure.py <name> directly
            name = path.stem.removeprefix("timing-")
            programs = (f"make measure NAME={name}", f"python3 hack/measure.py {name}")
        else:  # python -m benchmarks.<module> [options]
            programs = (" ".join(block.command.split()[:3]),)
        assert record["command"].startswith(programs), (record["command"], programs)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["started"])
        assert record["seconds"] > 0
        assert record["figures"]
        assert {"cpu_cores", "memory_gib", "system", "python", "load_start", "load_end"} <= set(
            record["machine"]
        )
        assert "commit" in record["git"]


def _region(doc: Path, heading: str | None) -> list[tuple[int, str]]:
    lines = list(enumerate(doc.read_text().splitlines()))
    if heading is None:
        return lines
    start = next(i for i, line in lines if line.strip() == heading)
    end = next((i for i, line in lines[start + 1 :] if line.startswith("## ")), len(lines))
    return lines[start:end]


@pytest.mark.parametrize("doc", sorted(records.MEASURED_REGIONS), ids=lambda p: p.name)
def test_measured_tables_are_all_inside_blocks(doc: Path) -> None:
    inside, outside = False, []
    for number, line in _region(doc, records.MEASURED_REGIONS[doc]):
        if line.startswith("<!-- BEGIN MEASURED ") or line.startswith("<!-- BEGIN PENDING "):
            inside = True
        elif line.startswith("<!-- END MEASURED ") or line.startswith("<!-- END PENDING "):
            inside = False
        elif line.startswith("|") and not inside:
            outside.append(f"{doc.name}:{number + 1}: {line[:80]}")
    assert outside == [], "a table of measured figures typed outside a block:\n" + "\n".join(outside)


def test_hand_typed_timings_name_the_measurement_that_replaces_them_and_it_has_no_record() -> None:
    pending = [b for b in blocks_of(records.DEVELOPMENT_DOC) if b[:2] == ("PENDING", "local-cluster-times")]
    rows = [line for _, _, body in pending for line in body.splitlines() if line.startswith("| ")]
    rows = [row for row in rows if not row.startswith("| what |")]
    assert rows or not pending, "an empty PENDING block is left"
    for row in rows:
        names = re.findall(r"`make measure NAME=([\w-]+)`", row)
        assert names or BY_HAND in row, row
        for name in names:
            assert name in timings.BY_NAME, row
            assert records.load(timings.record_name(name)) is None, f"{name} has a record: drop its row"


# ------------------------------------------------------------------------------------- the machinery


def test_a_command_turns_its_pending_block_into_a_measured_one_and_keeps_the_rest() -> None:
    text = f"a\n{records.begin_pending('x')}\nold | 1 |\n{records.end_pending('x')}\nb\n"
    once = records.replace_block(text, "x", "new\n")
    assert once == f"a\n{records.begin_measured('x')}\nnew\n{records.end_measured('x')}\nb\n"
    assert records.replace_block(once, "x", "newer") == once.replace("new\n", "newer\n")
    with pytest.raises(ValueError, match="no MEASURED or PENDING block"):
        records.replace_block("a\n", "x", "new")


def test_a_record_drops_only_the_pending_rows_that_name_it() -> None:
    token = "`make measure NAME=cluster`"
    text = (
        f"| outside {token} |\n{records.begin_pending('t')}\n| what | by |\n|---|---|\n| a | {token} |\n"
        f"| b | `make measure NAME=cluster-no-autoscaling` |\n{records.end_pending('t')}\n"
    )
    dropped = records.drop_pending_rows(text, "t", token)
    assert "| a |" not in dropped
    assert "| b |" in dropped
    assert f"| outside {token} |" in dropped


def test_the_pending_block_goes_with_its_last_row() -> None:
    token = "`make measure NAME=demo`"
    pending = f"{records.begin_pending('t')}\n> note\n\n| what | by |\n|---|---|\n| x | {token} |\n"
    text = f"a\n\n{pending}{records.end_pending('t')}\n\nb\n"
    assert records.drop_pending_rows(text, "t", token) == "a\n\nb\n"


def test_runs_of_a_section_render_as_medians_with_each_run() -> None:
    runs = [
        [{"label": "x", "tok_s": 10.0, "ok": True}, {"label": "y", "tok_s": 4, "ok": True}],
        [{"label": "x", "tok_s": 30.0, "ok": False}, {"label": "y", "tok_s": 4, "ok": True}],
        [{"label": "x", "tok_s": 20.0, "ok": True}, {"label": "y", "tok_s": 4, "ok": True}],
    ]
    assert server_render.median_rows(runs) == [
        {"label": "x", "tok_s": 20.0, "ok": False},
        {"label": "y", "tok_s": 4, "ok": True},
    ]
    table = "| a |\n|---|\n| 1 |"
    assert server_render.with_column(table, "b", ["2"]) == "| a | b |\n|---|---|\n| 1 | 2 |"
    with pytest.raises(ValueError, match="different numbers of rows"):
        server_render.median_rows([runs[0], runs[1][:1]])


def test_the_timing_wrapper_times_steps_splits_phases_and_keeps_test_counts(tmp_path: Path) -> None:
    m = timings.Measurement(
        "unit",
        "a unit of work",
        (
            timings.Step(
                "work", "echo '[build] etcd v3'; sleep 0.3; echo '[build] kwok v1'; echo '7 passed in 0.3s'"
            ),
        ),
        rounds=2,
        phases=(("etcd", r"^\[build\] etcd "), ("kwok", r"^\[build\] kwok ")),
        env={"MARK": "{dir}"},
    )
    record = measure.measure(m, ["python3", "hack/measure.py", "unit"])
    path = records.save(record, tmp_path)
    loaded = json.loads(path.read_text())
    [first, second] = loaded["figures"]["rounds"]
    assert first[0]["seconds"] >= 0.3  # each round on its own: at least its sleep
    assert second[0]["seconds"] >= 0.3
    assert first[0]["phases"]["etcd"] >= 0.3
    assert set(first[0]["phases"]) == {"etcd", "kwok"}
    assert first[0]["tests"] == {"passed": 7}
    assert loaded["command"] == "python3 hack/measure.py unit"
    assert loaded["machine"]["load_end"] >= 0
    [row] = timings.rows(loaded, m)
    assert row[0] == "a unit of work"
    assert row[2].endswith("(2 runs)")
    assert row[3] == "7 passed"


def test_a_phase_that_times_itself_and_a_pytest_run_s_test_times_are_kept(tmp_path: Path) -> None:
    junit = (
        '<testsuites><testsuite><testcase classname="tests.unit.test_a" name="test_x" time="2.5"/>'
        '<testcase classname="tests.server.test_b" name="test_y[1]" time="0.5"/></testsuite></testsuites>'
    )
    (tmp_path / "report.xml").write_text(junit)
    # what `make test` does with the PYTEST_ARGS the measurement passes: here, copy the prepared report
    work = f"echo '[build] k8s built in 42s'; cp {tmp_path}/report.xml \"${{{{PYTEST_ARGS#--junitxml=}}}}\""
    m = timings.Measurement(
        "unit", "times", (timings.Step("x", work),), phases=timings.BUILD_PHASES, durations=True
    )
    [[result]] = measure.measure(m, ["python3", "hack/measure.py", "unit"])["figures"]["rounds"]
    assert result["phases"] == {"k8s": 42.0}
    assert result["durations"]["slowest"] == [
        ["tests/unit/test_a.py::test_x", 2.5],
        ["tests/server/test_b.py::test_y[1]", 0.5],
    ]
    assert result["durations"]["directories"]["tests/unit"] == {"tests": 1, "seconds": 2.5}


def test_a_measured_command_runs_as_if_typed_not_inside_make(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MAKEFLAGS", " -- NAME=test-warm")
    monkeypatch.setenv("MAKELEVEL", "1")
    m = timings.Measurement("unit", "env", (timings.Step("x", 'test -z "$MAKEFLAGS$MAKELEVEL"'),))
    # A step that fails raises StepFailed: a round means it passed, with no MAKEFLAGS and no MAKELEVEL.
    [[result]] = measure.measure(m, ["make", "measure", "NAME=unit"])["figures"]["rounds"]
    assert result["seconds"] >= 0


def test_a_failed_step_ends_the_measurement_before_any_record(tmp_path: Path) -> None:
    m = timings.Measurement(
        "unit", "fails", (timings.Step("x", "echo half; exit 3"), timings.Step("y", f"touch {tmp_path}/ran"))
    )
    with pytest.raises(measure.StepFailed, match="exited with 3"):
        measure.measure(m, ["python3", "hack/measure.py", "unit"])
    assert not (tmp_path / "ran").exists()


def test_durations_read_as_minutes_and_seconds() -> None:
    assert timings.duration(12.34) == "12.3 s"
    assert timings.duration(783.2) == "13 min 3 s"
    assert timings.span([12.3, 13.1, 12.8]) == "12.3 s to 13.1 s (3 runs)"


def a_record(name: str, figures: Any) -> records.Record:
    started = records.now()
    record = records.new_record(name, f"python -m benchmarks.{name}", started, records.machine_facts(), {})
    return records.finish(record, started, figures)


def test_an_operator_run_keeps_its_figures_through_json_and_renders_them() -> None:
    def audit(verb: str, resource: str) -> AuditEntry:
        return AuditEntry(1.0, verb, resource, 200)

    h100 = "NVIDIA-H100-80GB-HBM3"
    run = Results(
        count=2,
        replicas=3,
        pools=[NodePool(name="bench-h100", nodes=2, instance_type="p5.48xlarge", gpu=GpuSpec(h100, 8))],
        plan=Plan({"engine-a": 2}, {h100: 3}, []),
        reference=Rollout(10.0, 1.0, [8.0, 10.0]),
        operator=Rollout(12.0, 1.5, [9.0, 12.0]),
        ref_cleanup_seconds=3.0,
        audit_rollout=[
            audit("patch", "configmaps"),
            audit("patch", "configmaps"),
            audit("create", "events"),
            audit("watch", "pods"),
        ],
        audit_startup=[audit("list", "pods"), audit("watch", "pods")],
        audit_steady=[],
        metric_rollout=Counter({("PATCH", "configmaps"): 2, ("POST", "events"): 1}),
        metric_steady=Counter(),
        status_writes_rollout={"SpeculativeDeployment": 2},
        status_writes_steady={"SpeculativeDeployment": 0},
        steady_seconds=120.0,
        engine_builds=1,
        engine_phases=Counter({"Succeeded": 1}),
        jobs=1,
        job_pods=1,
        log_problems=Counter(),
        log_lines=[],
        usage={
            "started": ProcessUsage(80.0, 81.0, 2.0),
            "ready": ProcessUsage(100.0, 110.0, 8.0),
            "end": ProcessUsage(101.0, 110.0, 8.5),
        },
    )
    figures = operator_figures(run)
    in_memory = operator_report.render([a_record("operator", figures)])
    text = operator_report.render([a_record("operator", json.loads(json.dumps(figures)))])
    assert text.split("\n", 1)[1] == in_memory.split("\n", 1)[1]  # the same below the provenance line
    assert "| patch | configmaps | 2 | 1.00 | 2 |" in text
    assert "| create | events | 1 | 0.50 | 1 |" in text
    assert "| **all but watch** | | **3** | **1.50** | **3** |" in text
    assert "| **ratio operator / reference** | **1.20** |" in text
    assert "watches pods 1" in text
    assert "| rollout (until all Ready) | 100 MiB at the end | 6.0 (0.50 of a core over 12 s) |" in text
    assert "| **peak** | **110 MiB** | |" in text
    assert "Requests other than watches in the audit log: **0**, of which status writes: **0**" in text


def test_autoscaling_rounds_render_as_medians_per_path_and_their_ratio() -> None:
    def round_(path: str, up: float) -> dict[str, Any]:
        phases = {"metric": 1.0, "hpa": 2.0, "node": 3.0, "pod": up, "serving": up + 1.0, "up": up}
        return {"path": path, "seconds": {**phases, "down": 9.0, "node_gone": 20.0}}

    rounds = [round_("reference", 4.0), round_("operator", 3.0), round_("reference", 5.0)]
    rounds += [round_("operator", 4.0), round_("reference", 6.0), round_("operator", 5.0)]
    text = autoscaling_report.render([a_record("autoscaling", {"rounds": rounds})])
    pod_start = "| pod start (-> new replica Ready: the real server loaded its models) |"
    assert f"{pod_start} 5.0 | 4.0 | 0.80x |" in text
    assert "| metric above target -> new replica serving | 5.0 | 4.0 | 0.80x |" in text
    assert "3 rounds per path" in text
    assert "takes 4.0 s against 5.0 s" in text
