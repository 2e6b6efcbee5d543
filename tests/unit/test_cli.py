"""`specdeploy validate -f FILE` on good and bad files."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from specdeploy_operator.cli import main

from tests.example_files import example_files, example_id
from tests.unit.api_cases import BASES, INVALID_CASES

EXAMPLES = example_files()


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["validate", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def write(tmp_path: Path, text: str, name: str = "manifest.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_examples_are_valid(capsys: pytest.CaptureFixture[str], example: Path) -> None:
    code, out, err = run(capsys, "-f", str(example))
    assert (code, err) == (0, "")
    assert "valid" in out


def test_several_files_at_once(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [arg for path in EXAMPLES for arg in ("-f", str(path))]
    code, out, _ = run(capsys, *argv)
    assert code == 0
    assert out.count(": valid") == len(EXAMPLES)


def test_invalid_file_names_the_fields(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    case = next(case for case in INVALID_CASES if case.id == "draft-missing")
    code, out, err = run(capsys, "-f", write(tmp_path, yaml.safe_dump(case.manifest())))
    assert code == 1
    assert out == ""
    assert "SpeculativeDeployment/draft-missing): invalid" in err
    assert "  spec.draft: spec.draft is required when spec.speculative.method is draftTarget" in err


def test_schema_errors_are_listed_with_paths(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    doc = yaml.safe_load(EXAMPLES[0].read_text())
    doc["spec"]["replicas"] = -1
    doc["spec"]["target"]["tensorParallel"] = "2"
    doc["spec"]["runtime"]["max_batch_size"] = 8
    code, _, err = run(capsys, "-f", write(tmp_path, yaml.safe_dump(doc)))
    assert code == 1
    assert "spec.replicas: Input should be greater than or equal to 0" in err
    assert "spec.target.tensorParallel: Input should be a valid integer" in err
    assert 'spec.runtime.max_batch_size: unknown field "spec.runtime.max_batch_size"' in err


def test_multi_document_with_one_bad(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = INVALID_CASES[0].manifest()
    text = yaml.safe_dump(BASES["none"]) + "---\n" + yaml.safe_dump(bad) + "---\n"
    code, out, err = run(capsys, "-f", write(tmp_path, text))
    assert code == 1
    assert "document 1 (SpeculativeDeployment/base-none): valid" in out
    assert f"document 2 (SpeculativeDeployment/{bad['metadata']['name']}): invalid" in err
    assert INVALID_CASES[0].path in err


def test_kind_list(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [BASES["none"], BASES["eagle3"]]})
    code, out, _ = run(capsys, "-f", write(tmp_path, text))
    assert code == 0
    assert "document 1, item 2 (SpeculativeDeployment/base-eagle3): valid" in out


def test_not_yaml(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "-f", write(tmp_path, "spec: [unclosed\n"))
    assert code == 1
    assert "not valid YAML" in err


def test_not_a_mapping(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "-f", write(tmp_path, "- just\n- a list\n"))
    assert code == 1
    assert "expected a mapping" in err


def test_empty_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "-f", write(tmp_path, "# nothing here\n"))
    assert code == 1
    assert "no documents" in err


def test_missing_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "-f", str(tmp_path / "absent.yaml"))
    assert code == 1
    assert "cannot read" in err


def test_wrong_kind_and_api_version(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    wrong_kind = {**BASES["none"], "kind": "SpeculativeDeploymnet"}
    wrong_version = {**BASES["none"], "apiVersion": "specdeploy.dev/v1"}
    text = yaml.safe_dump(wrong_kind) + "---\n" + yaml.safe_dump(wrong_version)
    code, _, err = run(capsys, "-f", write(tmp_path, text))
    assert code == 1
    assert (
        "kind: expected one of SpeculativeDeployment, EngineBuild, DraftTraining, got 'SpeculativeDeploymnet'"
        in err
    )
    assert "apiVersion: expected specdeploy.dev/v1alpha1, got 'specdeploy.dev/v1'" in err


def test_other_kinds_fail_unless_skipped(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "hf-token"},
        "stringData": {"t": "x"},
    }
    path = write(tmp_path, yaml.safe_dump(secret) + "---\n" + yaml.safe_dump(BASES["none"]))
    assert run(capsys, "-f", path)[0] == 1
    code, out, _ = run(capsys, "-f", path, "--skip-other-kinds")
    assert code == 0
    assert "skipped (apiVersion 'v1')" in out


def test_stdin(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "stdin", io.StringIO(yaml.safe_dump(BASES["promptLookup"])))
    code, out, _ = run(capsys, "-f", "-")
    assert code == 0
    assert out.startswith("<stdin>: document 1")


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["validate"])
    assert raised.value.code == 2
    capsys.readouterr()


def test_as_a_subprocess(tmp_path: Path) -> None:
    bad = write(tmp_path, yaml.safe_dump(INVALID_CASES[-1].manifest()))
    good = str(EXAMPLES[0])
    command = [sys.executable, "-m", "specdeploy_operator.cli", "validate"]
    ok = subprocess.run([*command, "-f", good], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    failed = subprocess.run([*command, "-f", good, "-f", bad], capture_output=True, text=True, check=False)
    assert failed.returncode == 1
    assert INVALID_CASES[-1].path in failed.stderr
