"""The GPU benchmark of the reference backend (benchmarks/server/gpu_reference.py) runs end to end on the CPU
with a tiny shape: the code path a session lent a GPU runs with ``--device cuda``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from benchmarks.server import gpu_reference


def test_the_gpu_benchmark_measures_every_policy_at_every_concurrency(tmp_path: Path) -> None:
    out = tmp_path / "points.json"
    tiny_cpu = ["--device", "cpu", "--shape", "tiny", "--dtype", "float32", "--concurrency", "1", "2"]
    short = ["--rounds", "2", "--seconds", "0.3", "--warmup", "0.3", "--max-tokens", "16"]
    gpu_reference.main([*tiny_cpu, *short, "--out", str(out)])
    points = json.loads(out.read_text())
    assert [(p["concurrency"], p["policy"]) for p in points] == [
        (level, policy) for level in (1, 2) for policy in ("k=0", "k=4", "auto")
    ]
    for point in points:
        assert point["device"] == "cpu"
        assert len(point["windows_tok_s"]) == 2
        assert point["tok_s"] in point["windows_tok_s"]
        assert point["tok_s"] > 0
    by_policy = {(p["concurrency"], p["policy"]): p for p in points}
    for level in (1, 2):
        # plain decoding: one token per target step (a stop token inside a multi-step call cuts the rest)
        assert 0.0 < by_policy[(level, "k=0")]["tokens_per_step"] <= 1.0
        assert by_policy[(level, "k=4")]["tokens_per_step"] > 1.0  # the layer-skip draft is accepted
        # auto may rightly not speculate where drafting costs about what it saves (a tiny model on a CPU),
        # but a step emits at least its target token and at most that plus the cap of draft tokens
        assert 1.0 <= by_policy[(level, "auto")]["tokens_per_step"] <= 1.0 + gpu_reference.AUTO_CAP


def test_asking_for_cuda_where_there_is_none_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="no CUDA device"):
        gpu_reference.main(["--device", "cuda"])
