"""Golden files: every object `specdeploy render` prints for each example, byte for byte.

Regenerate after an intended change with
`SPECDEPLOY_UPDATE_GOLDEN=1 pytest tests/unit/test_builders_golden.py`
and review the diff."""

from __future__ import annotations

import io
import os
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.builders import OperatorSettings, dump_yaml, render_children
from specdeploy_operator.cli import main

from tests.example_files import example_files, example_id

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = example_files()
GOLDEN = Path(__file__).resolve().parent / "golden"
UPDATE = os.environ.get("SPECDEPLOY_UPDATE_GOLDEN") == "1"


def _render(example: Path) -> str:
    objects = []
    for body in yaml.safe_load_all(example.read_text()):
        if not body or body.get("kind") != "SpeculativeDeployment":
            continue
        sdep = parse_object(body)
        assert isinstance(sdep, SpeculativeDeployment)
        objects += render_children(sdep, OperatorSettings())
    return dump_yaml(objects)


@pytest.mark.parametrize("example", EXAMPLES, ids=[example_id(path) for path in EXAMPLES])
def test_golden(example: Path) -> None:
    golden = GOLDEN / f"{example_id(example)}.yaml"
    rendered = _render(example)
    if UPDATE:
        golden.write_text(rendered)
    assert golden.is_file(), f"no golden file {golden}; run with SPECDEPLOY_UPDATE_GOLDEN=1"
    assert rendered == golden.read_text(), (
        f"{example.name} renders differently from {golden}; if intended, regenerate with "
        "SPECDEPLOY_UPDATE_GOLDEN=1 and review the diff"
    )


def test_no_stale_golden_files() -> None:
    assert sorted(path.stem for path in GOLDEN.glob("*.yaml")) == sorted(
        example_id(path) for path in EXAMPLES
    )


@pytest.mark.parametrize("example", EXAMPLES[:2], ids=[example_id(path) for path in EXAMPLES[:2]])
def test_cli_render_prints_the_golden_objects(example: Path) -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["render", "-f", str(example)]) == 0
    assert out.getvalue() == (GOLDEN / f"{example_id(example)}.yaml").read_text()


def test_render_is_deterministic() -> None:
    assert _render(EXAMPLES[0]) == _render(EXAMPLES[0])


def test_cli_render_settings_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECDEPLOY_SERVER_IMAGE", "registry.example/server:1.2.3")
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["render", "-f", str(EXAMPLES[0]), "--settings-env", "-n", "team-a"]) == 0
    documents = list(yaml.safe_load_all(out.getvalue()))
    deployment = next(d for d in documents if d["kind"] == "Deployment")
    assert deployment["metadata"]["namespace"] == "team-a"
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == "registry.example/server:1.2.3"
    assert all(d["metadata"].get("namespace") == "team-a" for d in documents)


def test_cli_render_rejects_invalid(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: specdeploy.dev/v1alpha1\nkind: SpeculativeDeployment\nmetadata: {name: x}\nspec: {}\n"
    )
    assert main(["render", "-f", str(bad)]) == 1
