"""Flags the operator derives from a spec: the `trtllm-build` and `quantize.py` arguments of each engine.

Pure functions of the spec. The operator adds only paths and `--workers` (per-Job details that do not change
the engine), so the lists returned here are what an EngineBuild's content hash covers."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from .speculative import ModelSpec, SpeculativeDeploymentSpec

__all__ = [
    "DRAFT_TOKEN_METHODS",
    "MODELLED_BUILD_FLAGS",
    "OPERATOR_BUILD_FLAGS",
    "conflicting_args",
    "conflicting_args_cel",
    "flag_name",
    "render_build_flags",
    "render_quantize_args",
]

DRAFT_TOKEN_METHODS: Final = ("draftTarget", "promptLookup")
"""Methods whose target engine takes external draft tokens (`--speculative_decoding_mode
draft_tokens_external`)."""

OPERATOR_BUILD_FLAGS: Final = (
    "--checkpoint_dir",
    "--output_dir",
    "--workers",
    "--speculative_decoding_mode",
    "--max_draft_len",
    "--use_paged_context_fmha",
    "--gather_generation_logits",
    "--gather_context_logits",
    "--gather_all_token_logits",
    "--build_config",
    "--model_config",
)
"""trtllm-build flags the operator sets (or must keep off, like context logits, which cannot be gathered with
draft tokens); `build.extraArgs` may not contain them."""

MODELLED_BUILD_FLAGS: Final = {
    "--max_batch_size": "maxBatchSize",
    "--max_num_tokens": "maxNumTokens",
    "--max_input_len": "maxInputLen",
    "--max_seq_len": "maxSeqLen",
    "--gemm_plugin": "gemmPlugin",
    "--gemm_swiglu_plugin": "gemmSwigluPlugin",
    "--low_latency_gemm_plugin": "lowLatencyGemmPlugin",
    "--gpt_attention_plugin": "gptAttentionPlugin",
    "--use_fused_mlp": "useFusedMlp",
    "--use_fp8_context_fmha": "useFp8ContextFmha",
    "--reduce_fusion": "reduceFusion",
    "--multiple_profiles": "multipleProfiles",
}
"""trtllm-build flags that have a field in `build`, in the order they are rendered; `build.extraArgs` may not
repeat them."""

_MODELLED_ATTRIBUTES: Final = (
    ("--max_batch_size", "max_batch_size"),
    ("--max_num_tokens", "max_num_tokens"),
    ("--max_input_len", "max_input_len"),
    ("--max_seq_len", "max_seq_len"),
    ("--gemm_plugin", "gemm_plugin"),
    ("--gemm_swiglu_plugin", "gemm_swiglu_plugin"),
    ("--low_latency_gemm_plugin", "low_latency_gemm_plugin"),
    ("--gpt_attention_plugin", "gpt_attention_plugin"),
    ("--use_fused_mlp", "use_fused_mlp"),
    ("--use_fp8_context_fmha", "use_fp8_context_fmha"),
    ("--reduce_fusion", "reduce_fusion"),
    ("--multiple_profiles", "multiple_profiles"),
)


def flag_name(arg: str) -> str | None:
    """The flag an argument sets (`--max_draft_len=4` -> `--max_draft_len`), or None for a value."""
    if not arg.startswith("--"):
        return None
    return arg.split("=", 1)[0]


def conflicting_args(args: Iterable[str], flags: Iterable[str]) -> list[str]:
    """Arguments of `args` that set one of `flags`, also through an abbreviation (argparse accepts unambiguous
    prefixes, so `--max_draft=4` would set `--max_draft_len`)."""
    flags = tuple(flags)
    found = []
    for arg in args:
        name = flag_name(arg)
        if name is not None and any(flag.startswith(name) for flag in flags):
            found.append(arg)
    return found


def conflicting_args_cel(list_expr: str, flags: Sequence[str]) -> str:
    """CEL twin of `conflicting_args`: true when no item of the list `list_expr` sets one of `flags`."""
    quoted = ", ".join(f"'{flag}'" for flag in flags)
    name = "(a.contains('=') ? a.substring(0, a.indexOf('=')) : a)"
    return f"{list_expr}.all(a, !a.startsWith('--') || ![{quoted}].exists(f, f.startsWith({name})))"


def render_build_flags(spec: SpeculativeDeploymentSpec, role: Literal["target", "draft"]) -> list[str]:
    """The trtllm-build arguments of one engine of `spec`, without `--checkpoint_dir`, `--output_dir` and
    `--workers`.

    Order: modelled flags (in `MODELLED_BUILD_FLAGS` order, only those set), `--use_paged_context_fmha enable`
    (always: draft tokens and KV cache reuse need it), for the target of `draftTarget`/`promptLookup`
    `--speculative_decoding_mode draft_tokens_external --max_draft_len <maxDraftLen>`, with
    `acceptance: logits` `--gather_generation_logits`, then `build.extraArgs` verbatim.
    """
    if spec.backend != "tensorrt":
        raise ValueError(f"backend {spec.backend} builds no engine")
    model = spec.target if role == "target" else spec.draft
    if model is None:
        raise ValueError("the spec has no draft model")
    flags: list[str] = []
    build = model.build
    if build is not None:
        for flag, attribute in _MODELLED_ATTRIBUTES:
            value = getattr(build, attribute)
            if value is not None:
                flags += [flag, str(value)]
    flags += ["--use_paged_context_fmha", "enable"]
    if role == "target" and spec.speculative.method in DRAFT_TOKEN_METHODS:
        flags += [
            "--speculative_decoding_mode",
            "draft_tokens_external",
            "--max_draft_len",
            str(spec.speculative.max_draft_len),
        ]
    if spec.speculative.acceptance == "logits":
        flags.append("--gather_generation_logits")
    if build is not None and build.extra_args:
        flags += build.extra_args
    return flags


def render_quantize_args(model: ModelSpec) -> list[str]:
    """The TensorRT-LLM `quantize.py` arguments that turn the checkpoint into a TensorRT-LLM checkpoint,
    without `--model_dir` and `--output_dir`. Format `none` converts without quantizing the weights
    (`full_prec`)."""
    quantization = model.quantization
    args = ["--dtype", quantization.dtype]
    args += ["--qformat", "full_prec" if quantization.format == "none" else quantization.format]
    if quantization.kv_cache_dtype != "auto":
        args += ["--kv_cache_dtype", quantization.kv_cache_dtype]
    if quantization.format != "none" or quantization.kv_cache_dtype != "auto":
        args += ["--calib_size", str(quantization.calib_size)]
    args += ["--tp_size", str(model.tensor_parallel), "--pp_size", str(model.pipeline_parallel)]
    return args
