"""The status vocabulary (`specdeploy_operator.api.conditions`) is the one place that spells condition types,
phases and reasons: the schema's phase values agree with it, every condition type lists its reasons, and no
other module of the operator writes a condition type as a string."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import get_args

from specdeploy_operator.api import (
    CONDITION_REASONS,
    CREATION_REASONS,
    BuildPhase,
    ConditionType,
    DeploymentPhase,
    EngineBuild,
    Reason,
    SpeculativeDeployment,
)
from specdeploy_operator.api.conditions import EngineBuildPhase, Phase

from hack import docgen

SOURCE = Path(__file__).resolve().parents[2] / "operator" / "src" / "specdeploy_operator"
VOCABULARY = SOURCE / "api" / "conditions.py"


def test_the_schemas_phases_are_the_vocabularys() -> None:
    assert list(get_args(Phase)) == [phase.value for phase in DeploymentPhase]
    assert list(get_args(EngineBuildPhase)) == [phase.value for phase in BuildPhase]
    sdep_phase = SpeculativeDeployment.model_json_schema()["$defs"]["SpeculativeDeploymentStatus"]
    assert sdep_phase["properties"]["phase"]["anyOf"][0]["enum"] == [p.value for p in DeploymentPhase]
    build_phase = EngineBuild.model_json_schema()["$defs"]["EngineBuildStatus"]
    assert build_phase["properties"]["phase"]["anyOf"][0]["enum"] == [p.value for p in BuildPhase]


def test_every_condition_type_lists_its_reasons() -> None:
    assert set(CONDITION_REASONS) == set(ConditionType)
    for reasons in CONDITION_REASONS.values():
        assert len(set(reasons)) == len(reasons)
    for type_ in (ConditionType.ENGINES_READY, ConditionType.DEGRADED, ConditionType.SUCCEEDED):
        assert set(CONDITION_REASONS[type_]) >= CREATION_REASONS, type_


def test_reasons_of_no_condition_are_the_events() -> None:
    in_conditions = {reason for reasons in CONDITION_REASONS.values() for reason in reasons}
    assert set(Reason) - in_conditions == {
        Reason.BUILD_STARTED,
        Reason.ROLLOUT_STARTED,
        Reason.DEPLOYING,
        Reason.ROLLOUT_FINISHED,
        Reason.WORKLOAD_REPLACED,
        Reason.AUTOSCALER_FAILED,
        Reason.DEGRADED,
    }


def _strings(tree: ast.AST) -> list[tuple[int, str]]:
    """String constants of `tree` that are not docstrings."""
    docstrings = {
        id(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
    }
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
    ]


def test_no_module_but_the_vocabulary_spells_a_condition_type() -> None:
    types = {str(type_) for type_ in ConditionType}
    found = [
        f"{path.relative_to(SOURCE)}:{line}: {value!r}"
        for path in sorted(SOURCE.rglob("*.py"))
        if path != VOCABULARY
        for line, value in _strings(ast.parse(path.read_text()))
        if value in types
    ]
    assert found == []


def test_the_docs_table_has_a_row_for_every_condition() -> None:
    table = docgen.conditions_table()
    for type_, reasons in CONDITION_REASONS.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| `{type_}` |"))
        assert all(f"`{reason}`" in row for reason in reasons)
