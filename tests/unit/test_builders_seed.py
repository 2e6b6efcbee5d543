"""The build Job's command lines against seed 000's own commands (quantize.py and the two trtllm-build)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.builders import OperatorSettings, build_commands, build_engine_builds, build_job

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEED_000 = Path("/work/shared/seeds/000_b99938bc1c23643f.txt")

# Verbatim from seed 000 (line 15, then lines 20 and 23), backticks removed.
SEED_QUANTIZE = (
    "python /opt/TensorRT-LLM-examples/quantization/quantize.py --model_dir <path to hugging face weights> "
    "--dtype auto --qformat fp8 --kv_cache_dtype fp8 --output_dir <output directory for checkpoints> "
    "--calib_size 512 --tp_size 2 --pp_size 1"
)
SEED_TARGET_BUILD = (
    "trtllm-build --checkpoint_dir <path to checkpoints>  --output_dir  <output directory for engines>  "
    "--max_num_tokens 4096 --max_input_len 127000 --max_seq_len 128000 --max_batch_size 128 --use_fused_mlp "
    "enable  --use_paged_context_fmha enable --gemm_plugin fp8 --use_fp8_context_fmha enable "
    "--gemm_swiglu_plugin fp8 --max_draft_len=10 --speculative_decoding_mode=draft_tokens_external "
    "--gather_generation_logits"
)
SEED_DRAFT_BUILD = (
    "trtllm-build --checkpoint_dir <path to checkpoints>  --output_dir  <output directory for engines>  "
    "--max_num_tokens 4096 --max_input_len 127000 --max_seq_len 128000 --max_batch_size 128 --use_fused_mlp "
    "enable  --use_paged_context_fmha enable --gemm_plugin fp8 --use_fp8_context_fmha enable "
    "--gemm_swiglu_plugin fp8 --gather_generation_logits"
)
PATH_FLAGS = ("--model_dir", "--output_dir", "--checkpoint_dir")


def _argv(command: str) -> list[str]:
    """Split a seed command line; `<placeholder text>` becomes one `PATH` argument."""
    return re.sub(r"<[^>]*>", "PATH", command).split()


def _with_placeholders(argv: list[str]) -> list[str]:
    out = list(argv)
    for index, arg in enumerate(out[:-1]):
        if arg in PATH_FLAGS:
            out[index + 1] = "PATH"
    return out


def _flag_map(argv: list[str]) -> dict[str, str | None]:
    """`--flag value` / `--flag=value` / `--flag` as a mapping (trtllm-build parses them the same)."""
    pairs: dict[str, str | None] = {}
    items = [part for arg in argv[1:] for part in (arg.split("=", 1) if arg.startswith("--") else [arg])]
    index = 0
    while index < len(items):
        flag = items[index]
        assert flag.startswith("--"), (flag, items)
        value = items[index + 1] if index + 1 < len(items) and not items[index + 1].startswith("--") else None
        assert flag not in pairs, f"{flag} twice"
        pairs[flag] = value
        index += 1 if value is None else 2
    return pairs


@pytest.fixture(scope="module")
def engines() -> list[dict[str, Any]]:
    body = yaml.safe_load((EXAMPLES / "tensorrt" / "01-draft-target-llama70b-8b-h100.yaml").read_text())
    sdep = parse_object(body)
    assert isinstance(sdep, SpeculativeDeployment)
    return build_engine_builds(sdep, OperatorSettings())


def test_seed_text_is_quoted_verbatim() -> None:
    # ../shared sits beside every checkout of this project (developers' and CI's): no skip.
    assert SEED_000.is_file(), f"{SEED_000} is missing: the seed documents live in ../shared/seeds"
    text = SEED_000.read_text()
    for command in (SEED_QUANTIZE, SEED_TARGET_BUILD, SEED_DRAFT_BUILD):
        assert f"`{command}`" in text


@pytest.mark.parametrize("role", ["target", "draft"])
def test_quantize_command_is_the_seeds(engines: list[dict[str, Any]], role: str) -> None:
    engine = next(e for e in engines if e["spec"]["role"] == role)
    commands = build_commands(engine, OperatorSettings())
    # Same flags, same order, same values; only the paths are the Job's.
    assert commands.checkpoint is not None
    assert _with_placeholders(commands.checkpoint) == _argv(SEED_QUANTIZE)


@pytest.mark.parametrize(("role", "seed"), [("target", SEED_TARGET_BUILD), ("draft", SEED_DRAFT_BUILD)])
def test_trtllm_build_command_is_the_seeds(engines: list[dict[str, Any]], role: str, seed: str) -> None:
    engine = next(e for e in engines if e["spec"]["role"] == role)
    commands = build_commands(engine, OperatorSettings())
    assert commands.build is not None
    rendered = _flag_map(_with_placeholders(commands.build))
    # --workers is the one flag the Job adds beyond the seed: build parallelism = TP (2 here).
    assert rendered.pop("--workers") == "2"
    assert rendered == _flag_map(_argv(seed))
    assert commands.build[0] == "trtllm-build"


def test_job_runs_the_commands_in_order(engines: list[dict[str, Any]]) -> None:
    engine = engines[0]
    commands = build_commands(engine, OperatorSettings())
    pod = build_job(engine, OperatorSettings())["spec"]["template"]["spec"]
    steps = [(c["name"], c["command"]) for c in pod["initContainers"] + pod["containers"]]
    assert [name for name, _ in steps] == ["download", "quantize", "build", "complete"]
    assert steps[1][1] == commands.checkpoint
    assert steps[2][1] == commands.build
    hash_ = engine["spec"]["hash"]
    assert commands.build is not None
    assert commands.engine_dir == f"/cache/engines/{hash_}"
    assert commands.build[commands.build.index("--output_dir") + 1] == f"/cache/engines/{hash_}"
    assert f"/cache/engines/{hash_}/.specdeploy-complete" in steps[3][1][-1]
