"""The GPU day (benchmarks/gpu_day.sh, benchmarks/server/gpu_day.py) runs end to end on the CPU with the tiny
shape: the code a machine with a GPU runs, section by section, records and their rendering included."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import records
from benchmarks.server import gpu_day, render

REPO = Path(__file__).resolve().parents[2]


def test_every_section_runs_on_the_cpu_and_writes_a_record_that_renders(tmp_path: Path) -> None:
    assert gpu_day.main(["--smoke", "--results", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(f"server-gpu-{s}.json" for s in records.GPU_SECTIONS)
    loaded = [json.loads((tmp_path / name).read_text()) for name in written]
    for record in loaded:
        assert record["machine"]["torch"]
        assert record["parameters"]["device"] == "cpu"
        (rows,) = record["figures"]["runs"]
        assert rows
    by_name = {r["name"].removeprefix("server-gpu-"): r["figures"]["runs"][0] for r in loaded}
    reference = by_name["reference-1b"]
    assert [(p["concurrency"], p["policy"]) for p in reference] == [
        (level, policy) for level in (1, 8) for policy in ("k=0", "k=4", "auto")
    ]
    assert all(p["vocab"] == gpu_day.SMOKE.vocab for p in reference)
    http = by_name["http"]
    assert [(p["concurrency"], p["mode"]) for p in http] == [
        (level, mode) for level in gpu_day.SMOKE.http_levels for mode in ("direct", "http")
    ]
    assert all(p["stream_tok_s"] > 0 and p["aggregate_tok_s"] > 0 and p["step_ms"] > 0 for p in http)
    structured = by_name["structured"]
    assert [(r["method"], r["constrained"]) for r in structured] == [
        (m, c) for m in ("none", "draftTarget") for c in (False, True)
    ]
    assert all(r["valid"] == r["requests"] for r in structured if r["constrained"])
    assert all(r["identical"] for r in structured)  # speculation changes no greedy output
    assisted = by_name["assisted"]
    assert {(r["method"], r["impl"].split()[0]) for r in assisted} == {
        (m, impl) for m in ("none", "draftTarget", "promptLookup") for impl in ("transformers", "specdeploy")
    }
    assert all(r["identical"] for r in assisted)
    text = render.gpu(loaded)
    for title, _, _ in render.GPU_TABLES.values():
        assert title in text


def test_the_wrapper_runs_a_section_and_logs_it(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    done = subprocess.run(
        ["bash", "benchmarks/gpu_day.sh", "--results", str(tmp_path), "--smoke", "--only", "structured"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert (tmp_path / "server-gpu-structured.json").exists()
    log = (tmp_path / "gpu-day.log").read_text()
    assert "torch" in log
    assert "== structured:" in log


def test_an_unknown_section_is_refused_by_name(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        gpu_day.main(["--smoke", "--only", "structured,nonsense"])
    assert "nonsense" in capsys.readouterr().err


def test_no_gpu_records_render_as_a_sentence_saying_how_to_measure() -> None:
    assert "bash benchmarks/gpu_day.sh" in render.gpu([])
