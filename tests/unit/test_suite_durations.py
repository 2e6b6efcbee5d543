"""Where the suite's time goes (benchmarks/durations.py): a JUnit report of `make test` summed by directory
and ranked, kept in the record of `make measure NAME=test-warm` and rendered into docs/development.md."""

from __future__ import annotations

from benchmarks import durations, records


def report(*cases: tuple[str, str, float]) -> str:
    rows = "".join(f'<testcase classname="{c}" name="{n}" time="{t}"/>' for c, n, t in cases)
    return f'<?xml version="1.0"?><testsuites><testsuite name="pytest">{rows}</testsuite></testsuites>'


def test_a_test_case_is_named_by_its_node_id_and_counted_in_its_directory() -> None:
    assert durations.node_id("tests.integration.test_operator", "test_x[01-a.yaml]") == (
        "tests/integration/test_operator.py::test_x[01-a.yaml]",
        "tests/integration",
    )
    assert durations.node_id("tests.unit.test_api.TestSpec", "test_y") == (
        "tests/unit/test_api.py::TestSpec::test_y",
        "tests/unit",
    )


def test_times_add_up_by_directory_and_the_slowest_come_first_ties_by_name() -> None:
    summary = durations.summarize(
        report(
            ("tests.unit.test_a", "test_one", 0.25),
            ("tests.integration.test_b", "test_two", 30.0),
            ("tests.integration.test_b", "test_three", 12.5),
            ("tests.unit.test_a", "test_four", 12.5),
        ),
        slowest=3,
    )
    assert summary["tests"] == 4
    assert summary["seconds"] == 55.2
    assert summary["directories"] == {
        "tests/integration": {"tests": 2, "seconds": 42.5},
        "tests/unit": {"tests": 2, "seconds": 12.8},
    }
    assert summary["slowest"] == [
        ["tests/integration/test_b.py::test_two", 30.0],
        ["tests/integration/test_b.py::test_three", 12.5],
        ["tests/unit/test_a.py::test_four", 12.5],
    ]


def test_the_docs_show_the_directories_by_time_then_the_slowest_tests_and_where_they_come_from() -> None:
    summary = durations.summarize(
        report(("tests.unit.test_a", "test_one", 1.0), ("tests.integration.test_b", "test_two", 90.0))
    )
    started = records.now()
    record = records.new_record(
        "timing-test-warm", "make measure NAME=test-warm", started, records.machine_facts(), {}
    )
    record = records.finish(record, started, {"rounds": [[{"seconds": 1021.0, "durations": summary}]]})
    text = durations.render([record])
    lines = text.splitlines()
    assert lines[0].startswith("2 tests, 1.5 min of test time over the workers, 17 min 1 s of wall time")
    directories = [line for line in lines if line.startswith("| `tests/") and "::" not in line]
    assert directories == ["| `tests/integration` | 1 | 90 s |", "| `tests/unit` | 1 | 1 s |"]
    assert "| `tests/integration/test_b.py::test_two` | 90.0 s |" in lines
    assert lines[-1] == f"- {records.provenance(record)}"
