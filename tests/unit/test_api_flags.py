"""Derived engine flags, checked against the seed documents' own commands, and the examples."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_operator.api import (
    OPERATOR_BUILD_FLAGS,
    SpeculativeDeployment,
    conflicting_args,
    parse_object,
    render_build_flags,
    render_quantize_args,
)
from specdeploy_operator.api.flags import flag_name

from tests.example_files import example_files

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

# Flags of the seeds' trtllm-build commands, without --checkpoint_dir, --output_dir and --workers (paths and
# build parallelism, which the operator adds per Job).
SEED_000_TARGET = (  # seed 000 line 20
    "--max_num_tokens 4096 --max_input_len 127000 --max_seq_len 128000 --max_batch_size 128 "
    "--use_fused_mlp enable --use_paged_context_fmha enable --gemm_plugin fp8 --use_fp8_context_fmha enable "
    "--gemm_swiglu_plugin fp8 --max_draft_len=10 --speculative_decoding_mode=draft_tokens_external "
    "--gather_generation_logits"
)
SEED_000_DRAFT = (  # seed 000 line 23
    "--max_num_tokens 4096 --max_input_len 127000 --max_seq_len 128000 --max_batch_size 128 "
    "--use_fused_mlp enable --use_paged_context_fmha enable --gemm_plugin fp8 --use_fp8_context_fmha enable "
    "--gemm_swiglu_plugin fp8 --gather_generation_logits"
)
SEED_003_405B_TARGET = (  # seed 003 lines 62-70
    "--gpt_attention_plugin float16 --gemm_plugin=fp8 --use_paged_context_fmha=enable --use_fused_mlp enable "
    "--multiple_profiles enable --max_batch_size=32 --max_num_tokens=8192 --max_seq_len=131072 "
    "--low_latency_gemm_plugin fp8 --speculative_decoding_mode=draft_tokens_external --max_draft_len 10"
)
SEED_003_405B_DRAFT = (  # seed 003 lines 53-61
    "--gpt_attention_plugin float16 --gemm_plugin=fp8 --reduce_fusion disable "
    "--use_paged_context_fmha=enable --use_fused_mlp enable --multiple_profiles enable --max_batch_size=32 "
    "--max_num_tokens=8192 --max_seq_len=131072"
)
SEED_001_TARGET = (  # seed 001 (one line): trtllm-build of ./target-engine, plus logits for use_logits=True
    "--gemm_plugin=float16 --use_paged_context_fmha=enable --speculative_decoding_mode=draft_tokens_external "
    "--max_draft_len=10 --max_batch_size=4 --max_input_len=3200 --max_seq_len=4800 --gather_generation_logits"
)
SEED_004_TARGET = (  # seed 004 lines 26-35
    "--gemm_plugin=float16 --use_paged_context_fmha=enable --speculative_decoding_mode=draft_tokens_external "
    "--max_draft_len=10 --max_batch_size=4 --max_input_len=3200 --max_seq_len=4800"
)
SEED_003_BASELINE_STYLE = (  # seed 000 line 20 without the speculative flags (scenario 7's baseline)
    "--max_num_tokens 4096 --max_input_len 127000 --max_seq_len 128000 --max_batch_size 128 "
    "--use_fused_mlp enable --use_paged_context_fmha enable --gemm_plugin fp8 --use_fp8_context_fmha enable "
    "--gemm_swiglu_plugin fp8"
)


def flag_set(args: list[str] | str) -> set[tuple[str, str | None]]:
    """{(flag, value)} of an argument list, accepting `--f v` and `--f=v` forms."""
    tokens = args.split() if isinstance(args, str) else list(args)
    pairs: set[tuple[str, str | None]] = set()
    i = 0
    while i < len(tokens):
        token = tokens[i]
        assert token.startswith("--"), tokens
        if "=" in token:
            name, value = token.split("=", 1)
            pairs.add((name, value))
            i += 1
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            pairs.add((token, tokens[i + 1]))
            i += 2
        else:
            pairs.add((token, None))
            i += 1
    return pairs


def example(name: str) -> SpeculativeDeployment:
    parsed = parse_object(yaml.safe_load((EXAMPLES / name).read_text()))
    assert isinstance(parsed, SpeculativeDeployment)
    return parsed


@pytest.mark.parametrize(
    ("file", "role", "seed_flags"),
    [
        ("tensorrt/01-draft-target-llama70b-8b-h100.yaml", "target", SEED_000_TARGET),
        ("tensorrt/01-draft-target-llama70b-8b-h100.yaml", "draft", SEED_000_DRAFT),
        ("tensorrt/03-draft-target-dedicated-logits.yaml", "target", SEED_001_TARGET),
        ("tensorrt/04a-draft-target-llama405b-1b-4xh200.yaml", "target", SEED_003_405B_TARGET),
        ("tensorrt/04a-draft-target-llama405b-1b-4xh200.yaml", "draft", SEED_003_405B_DRAFT),
        ("tensorrt/05-prompt-lookup-llama13b.yaml", "target", SEED_004_TARGET),
        ("tensorrt/07-baseline-llama70b-none.yaml", "target", SEED_003_BASELINE_STYLE),
    ],
)
def test_rendered_flags_match_the_seed_commands(file: str, role: Any, seed_flags: str) -> None:
    rendered = render_build_flags(example(file).spec, role)
    assert flag_set(rendered) == flag_set(seed_flags)
    assert "--workers" not in rendered
    assert "--checkpoint_dir" not in rendered


def test_70b_1b_on_one_h200_matches_the_405b_recipe() -> None:
    """seed 003 lines 79-96 repeat lines 53-70 with --workers 1: the same flags."""
    small = example("tensorrt/04b-draft-target-llama70b-1b-h200.yaml").spec
    assert flag_set(render_build_flags(small, "target")) == flag_set(SEED_003_405B_TARGET)
    assert flag_set(render_build_flags(small, "draft")) == flag_set(SEED_003_405B_DRAFT)


def test_quantize_args_match_seed_000() -> None:
    """seed 000 line 15, without --model_dir and --output_dir."""
    spec = example("tensorrt/01-draft-target-llama70b-8b-h100.yaml").spec
    expected = "--dtype auto --qformat fp8 --kv_cache_dtype fp8 --calib_size 512 --tp_size 2 --pp_size 1"
    assert render_quantize_args(spec.target) == expected.split()
    assert spec.draft is not None
    assert render_quantize_args(spec.draft) == expected.split()


def test_quantize_args_without_quantization() -> None:
    spec = example("tensorrt/05-prompt-lookup-llama13b.yaml").spec
    assert render_quantize_args(spec.target) == [
        "--dtype",
        "float16",
        "--qformat",
        "full_prec",
        "--tp_size",
        "1",
        "--pp_size",
        "1",
    ]


def test_flag_order_is_deterministic() -> None:
    spec = example("tensorrt/01-draft-target-llama70b-8b-h100.yaml").spec
    assert render_build_flags(spec, "target") == [
        "--max_batch_size", "128",
        "--max_num_tokens", "4096",
        "--max_input_len", "127000",
        "--max_seq_len", "128000",
        "--gemm_plugin", "fp8",
        "--gemm_swiglu_plugin", "fp8",
        "--use_fused_mlp", "enable",
        "--use_fp8_context_fmha", "enable",
        "--use_paged_context_fmha", "enable",
        "--speculative_decoding_mode", "draft_tokens_external",
        "--max_draft_len", "10",
        "--gather_generation_logits",
    ]  # fmt: skip


def test_extra_args_come_last_verbatim() -> None:
    doc = yaml.safe_load((EXAMPLES / "tensorrt/05-prompt-lookup-llama13b.yaml").read_text())
    doc["spec"]["target"]["build"]["extraArgs"] = [
        "--log_level=verbose",
        "--max_prompt_embedding_table_size",
        "0",
    ]
    parsed = parse_object(doc)
    assert isinstance(parsed, SpeculativeDeployment)
    flags = render_build_flags(parsed.spec, "target")
    assert flags[-3:] == ["--log_level=verbose", "--max_prompt_embedding_table_size", "0"]


def test_max_draft_len_follows_the_spec() -> None:
    doc = yaml.safe_load((EXAMPLES / "tensorrt/05-prompt-lookup-llama13b.yaml").read_text())
    doc["spec"]["speculative"]["maxDraftLen"] = 16
    parsed = parse_object(doc)
    assert isinstance(parsed, SpeculativeDeployment)
    flags = render_build_flags(parsed.spec, "target")
    assert flags[flags.index("--max_draft_len") + 1] == "16"


def test_no_engine_for_pytorch_or_a_missing_draft() -> None:
    with pytest.raises(ValueError, match="pytorch"):
        render_build_flags(example("06-eagle3-pytorch-tp8.yaml").spec, "target")
    with pytest.raises(ValueError, match="no draft"):
        render_build_flags(example("tensorrt/05-prompt-lookup-llama13b.yaml").spec, "draft")


@pytest.mark.parametrize(
    ("args", "conflicts"),
    [
        (["--max_draft_len=4"], ["--max_draft_len=4"]),
        (["--max_draft_len", "4"], ["--max_draft_len"]),
        (["--max_draft=4"], ["--max_draft=4"]),  # argparse abbreviation
        (["--workers", "8"], ["--workers"]),
        (["--gather_all_token_logits"], ["--gather_all_token_logits"]),
        (["--log_level=info", "8", "--strongly_typed"], []),
        (["--max_beam_width", "1"], []),
        (["max_draft_len=4"], []),  # a value, not a flag
    ],
)
def test_conflicting_args(args: list[str], conflicts: list[str]) -> None:
    assert conflicting_args(args, OPERATOR_BUILD_FLAGS) == conflicts


def test_flag_name() -> None:
    assert flag_name("--a=b=c") == "--a"
    assert flag_name("--a") == "--a"
    assert flag_name("a") is None


@pytest.mark.parametrize(
    ("file", "gpus"),
    [
        ("01-draft-target-llama70b-8b-h100.yaml", 2),  # seed 000: two H100s, draft colocated
        ("02-draft-target-llama8b-1b-h100.yaml", 1),
        ("03-draft-target-llama13b-7b.yaml", 1),  # seed 001's pair, the draft on the target's GPU
        ("04a-draft-target-llama405b-1b-4xh200.yaml", 4),  # seed 003: four H200s
        ("04b-draft-target-llama70b-1b-h200.yaml", 1),  # seed 003: one H200
        ("05-prompt-lookup-llama13b.yaml", 1),
        ("06-eagle3-pytorch-tp8.yaml", 8),  # seed 002: --tp_size 8
        ("07-baseline-llama70b-none.yaml", 2),
        ("08-autoscaling-llama8b-1b-h100.yaml", 1),  # scenario 2, autoscaled
        ("09-transformers-cpu-tiny.yaml", 0),  # on CPUs
        ("10-transformers-gpu-llama8b-1b.yaml", 1),
        ("11-mtp-deepseek-r1-2x8xh100.yaml", 16),  # two nodes of eight
        ("12-draft-target-llama405b-8b-2x8xh100.yaml", 16),  # two nodes, the draft on the same GPUs
        ("tensorrt/01-draft-target-llama70b-8b-h100.yaml", 2),
        ("tensorrt/02-draft-target-llama8b-1b-h100.yaml", 1),
        ("tensorrt/03-draft-target-dedicated-logits.yaml", 2),  # seed 001: draft GPU 0, target GPU 1
        ("tensorrt/04a-draft-target-llama405b-1b-4xh200.yaml", 4),
        ("tensorrt/04b-draft-target-llama70b-1b-h200.yaml", 1),
        ("tensorrt/05-prompt-lookup-llama13b.yaml", 1),
        ("tensorrt/07-baseline-llama70b-none.yaml", 2),
        ("tensorrt/08-autoscaling-llama8b-1b-h100.yaml", 1),
    ],
)
def test_examples_gpus_per_replica(file: str, gpus: int) -> None:
    assert example(file).spec.gpus_per_replica == gpus
    assert example(file).spec.nodes_per_replica == (2 if gpus == 16 else 1)


def test_every_seed_scenario_has_a_maintained_example_and_its_engine_build() -> None:
    """Every example of the engine path has one on the maintained path with the same target; only the
    seed's dedicated draft GPU and logits acceptance stay engine-only (examples/03)."""
    maintained = {path.name[:3]: example(path.name).spec for path in EXAMPLES.glob("*.yaml")}
    for path in (EXAMPLES / "tensorrt").glob("*.yaml"):
        engine = example(f"tensorrt/{path.name}").spec
        twin = maintained[path.name[:3]]
        assert (engine.backend, twin.backend) == ("tensorrt", "pytorch"), path.name
        assert twin.target.model.uri == engine.target.model.uri, path.name
        assert twin.speculative.method == engine.speculative.method, path.name


def test_every_example_is_covered_and_valid() -> None:
    files = [path.relative_to(EXAMPLES).as_posix() for path in example_files()]
    assert len(files) == 21
    for name in files:
        example(name)


def test_scenario_numbers() -> None:
    """The issue's numbers: maxDraftLen 10 and 3, draftLen 10 with n-gram 2, dedicated logits, draftLen 4."""
    assert example("tensorrt/04a-draft-target-llama405b-1b-4xh200.yaml").spec.speculative.max_draft_len == 10
    eagle = example("06-eagle3-pytorch-tp8.yaml").spec
    assert (eagle.backend, eagle.target.tensor_parallel, eagle.speculative.max_draft_len) == ("pytorch", 8, 3)
    lookup = example("tensorrt/05-prompt-lookup-llama13b.yaml").spec.speculative
    assert lookup.prompt_lookup is not None
    assert (lookup.effective_draft_len, lookup.prompt_lookup.max_matching_ngram_size) == (10, 2)
    dedicated = example("tensorrt/03-draft-target-dedicated-logits.yaml").spec
    assert (dedicated.speculative.draft_len, dedicated.speculative.acceptance) == (4, "logits")
    assert dedicated.placement.draft == "dedicated"
    assert example("tensorrt/07-baseline-llama70b-none.yaml").spec.speculative.method == "none"
