"""Flags the operator derives from a spec: the `trtllm-build` and `quantize.py` arguments of each engine.

Pure functions of the spec. The operator adds only paths and `--workers` (per-Job details that do not change
the engine), so the lists returned here are what an EngineBuild's content hash covers. The flag tables are
`buildflags.py`'s, re-exported here."""

from __future__ import annotations

from typing import Literal

from .buildflags import (
    DRAFT_TOKEN_METHODS,
    MODELLED_ATTRIBUTES,
    MODELLED_BUILD_FLAGS,
    OPERATOR_BUILD_FLAGS,
    conflicting_args,
    conflicting_args_cel,
    flag_name,
)
from .modelspec import ModelSpec
from .spec import SpeculativeDeploymentSpec

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
        for flag, attribute in MODELLED_ATTRIBUTES:
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
