"""The tables of docs/operator.md that come from code (settings from OperatorSettings, rendered objects from
`specdeploy render` of the examples) are what `make docs` (hack/docgen.py) renders now; docs/install.md's
tables come from `helm template` and are checked by tests/chart/test_chart_docs.py."""

from __future__ import annotations

import pytest
from specdeploy_operator.builders import OperatorSettings

from hack import docgen


def test_committed_operator_doc_is_current() -> None:
    text = docgen.OPERATOR_DOC.read_text()
    assert docgen.operator_doc(text) == text, "docs/operator.md is stale: run `make docs`"


def test_committed_trtllm_doc_names_the_pins_and_each_methods_first_release() -> None:
    text = docgen.TRTLLM_DOC.read_text()
    assert docgen.trtllm_doc(text) == text, "docs/trtllm.md is stale: run `make docs`"


def test_every_setting_has_a_row_and_the_chart_sets_it() -> None:
    table = docgen.settings_table()
    chart = docgen.chart_values_by_env((docgen.CHART / "templates" / "deployment.yaml").read_text())
    for name in OperatorSettings.model_fields:
        env = f"SPECDEPLOY_{name.upper()}"
        assert f"| `{env}` |" in table
        assert env in chart, f"the chart does not set {env}"


def test_every_rendered_kind_has_a_row() -> None:
    table = docgen.rendered_objects_table()
    kinds = {str(o["kind"]) for item in docgen.rendered_inputs() for o in item.objects}
    assert kinds >= {"EngineBuild", "Job", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
    assert kinds >= {"HorizontalPodAutoscaler", "ScaledObject", "PersistentVolumeClaim"}
    for kind in kinds:
        assert f"| {kind} |" in table


def test_a_block_needs_its_markers() -> None:
    with pytest.raises(ValueError, match="markers"):
        docgen.replace_block("no markers here", "settings", "| a |")
    text = f"a\n{docgen.begin_marker('x')}\nold\n{docgen.end_marker('x')}\nb\n"
    assert (
        docgen.replace_block(text, "x", "new\n")
        == f"a\n{docgen.begin_marker('x')}\nnew\n{docgen.end_marker('x')}\nb\n"
    )
