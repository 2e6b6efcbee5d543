"""One model of a SpeculativeDeployment (`spec.target`, `spec.draft`): its checkpoint, parallelism,
quantization and engine build settings. The rules that relate a model to the rest of the spec live with
the spec (`spec.py`)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints

from .base import ApiModel
from .checkpoint import ModelSource, QuantizationSpec

__all__ = ["BuildSpec", "EnableDisable", "ModelSpec"]

EnableDisable = Literal["enable", "disable"]

_Limit = Annotated[int, Field(ge=1, le=16777216)]


class BuildSpec(ApiModel):
    """`trtllm-build` settings of one engine (backend `tensorrt` only).

    The operator adds the flags it owns: `--checkpoint_dir`, `--output_dir`, `--workers`,
    `--use_paged_context_fmha enable`, and for the target of `draftTarget`/`promptLookup`
    `--speculative_decoding_mode draft_tokens_external --max_draft_len <spec.speculative.maxDraftLen>`, plus
    `--gather_generation_logits` on both engines with `spec.speculative.acceptance: logits`. Unset fields are
    left to trtllm-build's defaults."""

    max_batch_size: Annotated[int, Field(ge=1, le=65536)] | None = None
    """Largest batch the engine accepts (`--max_batch_size`)."""
    max_num_tokens: _Limit | None = None
    """Most tokens in one engine step across the batch (`--max_num_tokens`)."""
    max_input_len: _Limit | None = None
    """Longest prompt in tokens (`--max_input_len`); at most `maxSeqLen`."""
    max_seq_len: _Limit | None = None
    """Longest sequence, prompt plus output, in tokens (`--max_seq_len`)."""
    gemm_plugin: (
        Literal["auto", "float16", "float32", "bfloat16", "int32", "fp8", "nvfp4", "disable"] | None
    ) = None
    """GEMM plugin precision (`--gemm_plugin`); `fp8` for FP8 checkpoints."""
    gemm_swiglu_plugin: Literal["fp8", "disable"] | None = None
    """Fused GEMM + SwiGLU plugin (`--gemm_swiglu_plugin`); `fp8` needs `quantization.format: fp8`."""
    low_latency_gemm_plugin: Literal["fp8", "disable"] | None = None
    """Low-latency GEMM plugin for small batches (`--low_latency_gemm_plugin`); `fp8` needs
    `quantization.format: fp8`."""
    gpt_attention_plugin: Literal["auto", "float16", "float32", "bfloat16", "int32", "disable"] | None = None
    """Attention plugin precision (`--gpt_attention_plugin`)."""
    use_fused_mlp: EnableDisable | None = None
    """Fuse the MLP's two GEMMs (`--use_fused_mlp`)."""
    use_fp8_context_fmha: EnableDisable | None = None
    """FP8 fused multi-head attention in the context phase (`--use_fp8_context_fmha`)."""
    reduce_fusion: EnableDisable | None = None
    """Fuse all-reduce with the following norm (`--reduce_fusion`), for tensor parallelism."""
    multiple_profiles: EnableDisable | None = None
    """Build several TensorRT optimisation profiles (`--multiple_profiles`)."""
    extra_args: (
        Annotated[
            list[Annotated[str, StringConstraints(pattern=r"^\S+$", min_length=1, max_length=256)]],
            Field(max_length=64),
        ]
        | None
    ) = None
    """Additional trtllm-build arguments for flags without a field here, one argument per item (`--flag=value`
    or `--flag`, `value`). Flags the operator derives, and flags that have a field above, are rejected."""


class ModelSpec(ApiModel):
    """One model of the deployment (the target or the draft): checkpoint, parallelism, quantization, build."""

    model: ModelSource
    """The checkpoint."""
    tensor_parallel: Annotated[int, Field(ge=1, le=64)] = 1
    """Tensor-parallel degree: GPUs that each layer is split across (`--tp_size`); 1 with backend
    `transformers`, which runs each model on one device."""
    pipeline_parallel: Annotated[int, Field(ge=1, le=64)] = 1
    """Pipeline-parallel degree (`--pp_size`); must be 1 while a speculative method is on, and with backend
    `transformers`."""
    quantization: QuantizationSpec = Field(
        default_factory=QuantizationSpec, json_schema_extra={"default": {}}
    )
    """Checkpoint conversion and quantization (backends `tensorrt` and `pytorch`); left at its defaults with
    `transformers`, which serves the checkpoint as it is."""
    build: BuildSpec | None = None
    """Engine build settings; only with `spec.backend: tensorrt`."""

    @property
    def gpus(self) -> int:
        """GPUs one copy of this model occupies."""
        return self.tensor_parallel * self.pipeline_parallel
