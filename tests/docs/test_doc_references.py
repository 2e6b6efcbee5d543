"""Every repository path, `make` target, test function, test file, metric name, flag and `SPECDEPLOY_*`
setting that README.md, docs/*.md, examples/README.md and benchmarks/README.md name exists: a doc cannot send
its reader to a file that moved, a target that was renamed, a test that is gone, a metric no server or
operator exports, or a flag or setting nothing reads."""

from __future__ import annotations

from pathlib import Path

import pytest
from specdeploy_server.backends.llmapi_acceptance import AcceptanceSources
from specdeploy_server.backends.llmapi_step_costs import StepCostCollector, WidthRule

from tests.docs.doc_references import (
    DOCS,
    REPO,
    Reference,
    code_names,
    defined_tests,
    makefile_targets,
    missing,
    references,
    top_level_entries,
)
from tests.unit.test_dashboard_metric_names import operator_metric_names, server_metric_names

_SUFFIXES = ("_total", "_bucket", "_sum", "_count")
KINDS = {"path", "link", "make target", "test function", "test file", "metric", "flag", "setting"}


def exported_metrics() -> frozenset[str]:
    """The sample names the server and the operator expose, and their families' names (a histogram
    `x_seconds` exposes `x_seconds_bucket`, `_sum` and `_count`; a counter `x` exposes `x_total`)."""
    llmapi = {family.name + "_total" for family in AcceptanceSources("m").collect()}  # trtllm-llmapi's own
    costs = StepCostCollector("m", WidthRule(1)).collect()
    llmapi |= {family.name + suffix for family in costs for suffix in ("", "_count", "_sum")}
    names = server_metric_names() | operator_metric_names() | llmapi
    families = {name.removesuffix(suffix) for name in names for suffix in _SUFFIXES if name.endswith(suffix)}
    return frozenset(names | families)


def _missing(doc: Path, markdown: str, root: Path = REPO) -> list[Reference]:
    functions, files = defined_tests(root / "tests")
    flags, settings = code_names(root)
    return missing(
        references(doc, markdown, top_level_entries(root)),
        root=root,
        targets=makefile_targets(root / "Makefile"),
        functions=functions,
        files=files,
        metrics=exported_metrics(),
        flags=flags,
        settings=settings,
    )


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_reference_of_the_doc_exists(doc: Path) -> None:
    bad = _missing(doc, doc.read_text())
    assert not bad, "references to nothing:\n" + "\n".join(map(str, bad))


def test_the_docs_name_references_of_every_kind() -> None:
    """The reader finds what the docs refer to: if it found none of a kind, the check would pass vacuously."""
    kinds = {ref.kind for doc in DOCS for ref in references(doc, doc.read_text(), top_level_entries())}
    assert kinds == KINDS


WRONG = """\
See `docs/no-such-page.md`, [the guide](no-such-guide.md) and
`hack/cluster/src/specdeploy_localcluster/gone.py`. Run `make no-such-target`; `test_a_behaviour_nobody_tests`
in `test_no_such_module.py` shows it, and `specdeploy_requests_invented_total{code}` counts it. Start the
server with `--no-such-flag` and `SPECDEPLOY_NO_SUCH_SETTING=1`.

```bash
make cluster-up NODEPOOLS=x.yaml && make bench-nothing
```
"""

RIGHT = """\
See `docs/server.md`, [the guide](server.md#metrics),
`tests/unit/test_docgen.py::test_a_block_needs_its_markers` and `hack/cluster/nodepools.yaml`. Run
`make test-unit PYTEST_ARGS=-x`; `test_committed_operator_doc_is_current` in `test_docgen.py` shows it;
`specdeploy_operator_api_requests_total{verb}`, `specdeploy_operator_reconcile_seconds` and its
`specdeploy_operator_reconcile_seconds_bucket`; packages `specdeploy_server` and `specdeploy_operator.api`,
the family `specdeploy_operator_*`; placeholders `benchmarks/results/<name>.json`, `<cache>/engines/<hash>/`;
`specdeploy-server --config server.yaml`, `up --no-autoscaling`, `helm upgrade --install`,
`SPECDEPLOY_LOW_ACCEPTANCE_RATE`.

```text
waiting --admitted--> running
```

```bash
make cluster-up NODEPOOLS=x.yaml && make demo
```
"""


def test_each_kind_of_wrong_reference_is_caught() -> None:
    bad = {(ref.kind, ref.name) for ref in _missing(REPO / "docs" / "planted.md", WRONG)}
    assert bad == {
        ("path", "docs/no-such-page.md"),
        ("link", "no-such-guide.md"),
        ("path", "hack/cluster/src/specdeploy_localcluster/gone.py"),
        ("make target", "no-such-target"),
        ("make target", "bench-nothing"),
        ("test function", "test_a_behaviour_nobody_tests"),
        ("test file", "test_no_such_module.py"),
        ("metric", "specdeploy_requests_invented_total"),
        ("flag", "--no-such-flag"),
        ("setting", "SPECDEPLOY_NO_SUCH_SETTING"),
    }


def test_references_that_exist_and_mentions_that_are_not_references_pass() -> None:
    refs = references(REPO / "docs" / "planted.md", RIGHT, top_level_entries())
    assert {ref.kind for ref in refs} == KINDS
    assert _missing(REPO / "docs" / "planted.md", RIGHT) == []


def test_the_map_of_the_docs_lists_every_page_once() -> None:
    """docs/README.md is the reading order: a page it leaves out is one a newcomer never reaches."""
    links = [
        ref.name
        for ref in references(
            REPO / "docs" / "README.md", (REPO / "docs" / "README.md").read_text(), frozenset()
        )
        if ref.kind == "link" and "/" not in ref.name
    ]
    pages = sorted(p.name for p in (REPO / "docs").glob("*.md") if p.name != "README.md")
    assert sorted(links) == pages
