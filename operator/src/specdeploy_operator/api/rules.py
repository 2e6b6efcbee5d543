"""Cross-field rules of the SpeculativeDeployment spec, each as CEL (for the CRD) and as Python (for
pydantic).

A rule is attached to the smallest object whose path is unique, so that its message can name the offending
field by its full path: rules about `spec.target` and `spec.draft` (which share one type) live on the spec.
Messages must stay free of line breaks (the apiserver requires it).

CEL notes: defaults are applied before validation, so defaulted fields (`speculative.maxDraftLen`,
`placement.draft`, `runtime.enableKvCacheReuse`, `target.quantization.format`, ...) are always present;
optional fields are guarded with `has()`; lists used in rules have `maxItems` and `maxLength` so the cost
estimate stays within the apiserver's budget."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

from .base import Rule, Rules
from .checkpoint import QuantizationSpec
from .flags import MODELLED_BUILD_FLAGS, OPERATOR_BUILD_FLAGS, conflicting_args, conflicting_args_cel

if TYPE_CHECKING:
    from .autoscaling import AutoscalingSpec
    from .speculative import (
        EngineCacheSpec,
        ModelSpec,
        PlacementSpec,
        RolloutSpec,
        ServingSpec,
        SpeculativeDeploymentSpec,
        SpeculativeSpec,
    )

__all__ = [
    "AUTOSCALING_RULES",
    "ENGINE_CACHE_RULES",
    "PLACEMENT_RULES",
    "ROLLOUT_RULES",
    "SERVING_RULES",
    "SPECULATIVE_RULES",
    "SPEC_RULES",
]

# --- spec.speculative----------------------------------------------------------------------------------------


def _draft_len_within_max(s: SpeculativeSpec) -> bool:
    return s.draft_len is None or s.draft_len == "auto" or s.draft_len <= s.max_draft_len


SPECULATIVE_RULES: Rules = (
    Rule["SpeculativeSpec"](
        name="draft-len-within-max",
        cel="!has(self.draftLen) || type(self.draftLen) == string || self.draftLen <= self.maxDraftLen",
        message="spec.speculative.draftLen must not exceed spec.speculative.maxDraftLen",
        field_path=".draftLen",
        check=_draft_len_within_max,
    ),
    Rule["SpeculativeSpec"](
        name="logits-need-draft-target",
        cel="self.acceptance != 'logits' || self.method == 'draftTarget'",
        message="spec.speculative.acceptance logits needs spec.speculative.method draftTarget "
        "(only a draft model produces logits)",
        field_path=".acceptance",
        check=lambda s: s.acceptance != "logits" or s.method == "draftTarget",
    ),
    Rule["SpeculativeSpec"](
        name="eagle-required",
        cel="self.method != 'eagle3' || has(self.eagle)",
        message="spec.speculative.eagle is required when spec.speculative.method is eagle3",
        field_path=".eagle",
        check=lambda s: s.method != "eagle3" or s.eagle is not None,
        reason="FieldValueRequired",
    ),
    Rule["SpeculativeSpec"](
        name="eagle-only-for-eagle3",
        cel="self.method == 'eagle3' || !has(self.eagle)",
        message="spec.speculative.eagle must not be set unless spec.speculative.method is eagle3",
        field_path=".eagle",
        check=lambda s: s.method == "eagle3" or s.eagle is None,
        reason="FieldValueForbidden",
    ),
    Rule["SpeculativeSpec"](
        name="prompt-lookup-only-for-prompt-lookup",
        cel="self.method == 'promptLookup' || !has(self.promptLookup)",
        message="spec.speculative.promptLookup must not be set unless "
        "spec.speculative.method is promptLookup",
        field_path=".promptLookup",
        check=lambda s: s.method == "promptLookup" or s.prompt_lookup is None,
        reason="FieldValueForbidden",
    ),
)


# --- spec.target and spec.draft------------------------------------------------------------------------------

_ModelCheck = Callable[["SpeculativeDeploymentSpec", "ModelSpec"], bool]


def _model_rules(role: Literal["target", "draft"]) -> list[Rule[SpeculativeDeploymentSpec]]:
    """Rules about one model of the spec, parametrised by role so messages carry the full path."""
    m = f"self.{role}"
    path = f"spec.{role}"

    def cel(expr: str) -> str:
        return expr if role == "target" else f"!has(self.draft) || ({expr})"

    def check(predicate: _ModelCheck) -> Callable[[SpeculativeDeploymentSpec], bool]:
        def run(spec: SpeculativeDeploymentSpec) -> bool:
            model = spec.target if role == "target" else spec.draft
            return model is None or predicate(spec, model)

        return run

    def rule(
        name: str, expr: str, message: str, field_path: str, predicate: _ModelCheck, **kw: Any
    ) -> Rule[Any]:
        return Rule["SpeculativeDeploymentSpec"](
            name=f"{role}-{name}",
            cel=cel(expr),
            message=message,
            field_path=f".{role}{field_path}",
            check=check(predicate),
            **kw,
        )

    def extra_args_ok(flags: tuple[str, ...]) -> _ModelCheck:
        def ok(_: SpeculativeDeploymentSpec, model: ModelSpec) -> bool:
            args = model.build.extra_args if model.build is not None else None
            return not args or not conflicting_args(args, flags)

        return ok

    def fp8_plugins_ok(_: SpeculativeDeploymentSpec, model: ModelSpec) -> bool:
        build = model.build
        if build is None or model.quantization.format == "fp8":
            return True
        return build.gemm_swiglu_plugin != "fp8" and build.low_latency_gemm_plugin != "fp8"

    def input_within_seq(_: SpeculativeDeploymentSpec, model: ModelSpec) -> bool:
        build = model.build
        if build is None or build.max_input_len is None or build.max_seq_len is None:
            return True
        return build.max_input_len <= build.max_seq_len

    has_args = f"!has({m}.build) || !has({m}.build.extraArgs) || "
    operator_flags = tuple(OPERATOR_BUILD_FLAGS)
    modelled_flags = tuple(MODELLED_BUILD_FLAGS)
    return [
        rule(
            "build-needs-tensorrt",
            f"self.backend == 'tensorrt' || !has({m}.build)",
            f"{path}.build must not be set unless spec.backend is tensorrt "
            "(only the tensorrt backend builds engines; pytorch and transformers load checkpoints)",
            ".build",
            lambda s, model: s.backend == "tensorrt" or model.build is None,
            reason="FieldValueForbidden",
        ),
        rule(
            "quantization-not-for-transformers",
            f"self.backend != 'transformers' || ({m}.quantization.format == 'none' && "
            f"{m}.quantization.kvCacheDtype == 'auto' && {m}.quantization.calibSize == 512 && "
            f"{m}.quantization.dtype == 'auto')",
            f"{path}.quantization must be left at its defaults when spec.backend is transformers "
            "(the checkpoint is served as it is, without quantization)",
            ".quantization",
            lambda s, model: s.backend != "transformers" or model.quantization == QuantizationSpec(),
        ),
        rule(
            "single-device-for-transformers",
            f"self.backend != 'transformers' || ({m}.tensorParallel == 1 && {m}.pipelineParallel == 1)",
            f"{path}.tensorParallel and {path}.pipelineParallel must be 1 when spec.backend is transformers "
            "(the reference backend runs each model on one device)",
            ".tensorParallel",
            lambda s, model: s.backend != "transformers" or model.gpus == 1,
        ),
        rule(
            "pipeline-parallel-without-speculation",
            f"self.speculative.method == 'none' || {m}.pipelineParallel == 1",
            f"{path}.pipelineParallel must be 1 when spec.speculative.method is not none "
            "(speculative decoding does not support pipeline parallelism)",
            ".pipelineParallel",
            lambda s, model: s.speculative.method == "none" or model.pipeline_parallel == 1,
        ),
        rule(
            "extra-args-derived-flags",
            has_args + conflicting_args_cel(f"{m}.build.extraArgs", operator_flags),
            f"{path}.build.extraArgs must not set flags the operator derives ({', '.join(operator_flags)})",
            ".build.extraArgs",
            extra_args_ok(operator_flags),
        ),
        rule(
            "extra-args-modelled-flags",
            has_args + conflicting_args_cel(f"{m}.build.extraArgs", modelled_flags),
            f"{path}.build.extraArgs must not set flags that have a field in {path}.build "
            f"({', '.join(modelled_flags)}): set the field instead",
            ".build.extraArgs",
            extra_args_ok(modelled_flags),
        ),
        rule(
            "input-len-within-seq-len",
            f"!has({m}.build) || !has({m}.build.maxInputLen) || !has({m}.build.maxSeqLen) || "
            f"{m}.build.maxInputLen <= {m}.build.maxSeqLen",
            f"{path}.build.maxInputLen must not exceed {path}.build.maxSeqLen",
            ".build.maxInputLen",
            input_within_seq,
        ),
        rule(
            "fp8-plugins-need-fp8",
            f"!has({m}.build) || {m}.quantization.format == 'fp8' || "
            f"((!has({m}.build.gemmSwigluPlugin) || {m}.build.gemmSwigluPlugin != 'fp8') && "
            f"(!has({m}.build.lowLatencyGemmPlugin) || {m}.build.lowLatencyGemmPlugin != 'fp8'))",
            f"{path}.build.gemmSwigluPlugin fp8 and {path}.build.lowLatencyGemmPlugin fp8 need "
            f"{path}.quantization.format fp8",
            ".build",
            fp8_plugins_ok,
        ),
    ]


# --- spec----------------------------------------------------------------------------------------------------


def _fits_on_node(s: SpeculativeDeploymentSpec) -> bool:
    return s.gpus_per_replica <= s.placement.gpus_per_node


def _colocated_draft_fits(s: SpeculativeDeploymentSpec) -> bool:
    if s.draft is None or s.placement.draft != "colocated":
        return True
    return s.draft.tensor_parallel <= s.target.tensor_parallel * s.target.pipeline_parallel


SPEC_RULES: Rules = (
    Rule["SpeculativeDeploymentSpec"](
        name="draft-required",
        cel="self.speculative.method != 'draftTarget' || has(self.draft)",
        message="spec.draft is required when spec.speculative.method is draftTarget",
        field_path=".draft",
        check=lambda s: s.speculative.method != "draftTarget" or s.draft is not None,
        reason="FieldValueRequired",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="draft-forbidden",
        cel="self.speculative.method == 'draftTarget' || !has(self.draft)",
        message="spec.draft must not be set unless spec.speculative.method is draftTarget "
        "(promptLookup, eagle3, mtp and none use no draft model)",
        field_path=".draft",
        check=lambda s: s.speculative.method == "draftTarget" or s.draft is None,
        reason="FieldValueForbidden",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="method-needs-pytorch",
        cel="!(self.speculative.method in ['eagle3', 'mtp']) || self.backend == 'pytorch'",
        message="spec.speculative.method eagle3 and mtp need spec.backend pytorch "
        "(tensorrt and transformers run draftTarget, promptLookup and none)",
        field_path=".speculative.method",
        check=lambda s: s.speculative.method not in ("eagle3", "mtp") or s.backend == "pytorch",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="logits-not-on-pytorch",
        cel="self.speculative.acceptance != 'logits' || self.backend != 'pytorch'",
        message="spec.speculative.acceptance logits needs spec.backend tensorrt or transformers "
        "(with pytorch TensorRT-LLM decides acceptance itself: use tokenMatch)",
        field_path=".speculative.acceptance",
        check=lambda s: s.speculative.acceptance != "logits" or s.backend != "pytorch",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="kv-cache-reuse-for-draft-tokens",
        cel="!(self.speculative.method in ['draftTarget', 'promptLookup']) || "
        "self.runtime.enableKvCacheReuse",
        message="spec.runtime.enableKvCacheReuse must be true when spec.speculative.method is draftTarget or "
        "promptLookup (every step re-sends the whole prefix)",
        field_path=".runtime.enableKvCacheReuse",
        check=lambda s: (
            s.speculative.method not in ("draftTarget", "promptLookup") or s.runtime.enable_kv_cache_reuse
        ),
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="dedicated-placement-needs-draft",
        cel="self.placement.draft != 'dedicated' || has(self.draft)",
        message="spec.placement.draft dedicated needs spec.draft",
        field_path=".placement.draft",
        check=lambda s: s.placement.draft != "dedicated" or s.draft is not None,
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="colocated-draft-fits",
        cel="!has(self.draft) || self.placement.draft != 'colocated' || "
        "self.draft.tensorParallel <= self.target.tensorParallel * self.target.pipelineParallel",
        message="spec.draft.tensorParallel must not exceed spec.target.tensorParallel x "
        "spec.target.pipelineParallel when spec.placement.draft is colocated "
        "(the draft runs on the target's GPUs)",
        field_path=".draft.tensorParallel",
        check=_colocated_draft_fits,
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="replica-fits-on-node",
        cel="self.placement.device == 'cpu' || self.target.tensorParallel * self.target.pipelineParallel + "
        "(has(self.draft) && self.placement.draft == 'dedicated' ? "
        "self.draft.tensorParallel * self.draft.pipelineParallel : 0) <= self.placement.gpusPerNode",
        message="GPUs per replica (spec.target.tensorParallel x spec.target.pipelineParallel, "
        "plus the same of spec.draft when spec.placement.draft is dedicated; none on cpu) "
        "must not exceed spec.placement.gpusPerNode",
        field_path=".placement.gpusPerNode",
        check=_fits_on_node,
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="draft-kv-fraction-needs-draft",
        cel="!has(self.runtime.draftKvCacheFreeGpuMemFraction) || has(self.draft)",
        message="spec.runtime.draftKvCacheFreeGpuMemFraction needs spec.draft",
        field_path=".runtime.draftKvCacheFreeGpuMemFraction",
        check=lambda s: s.runtime.draft_kv_cache_free_gpu_mem_fraction is None or s.draft is not None,
        reason="FieldValueForbidden",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="runtime-max-seq-len-needs-pytorch",
        cel="!has(self.runtime.maxSeqLen) || self.backend != 'tensorrt'",
        message="spec.runtime.maxSeqLen is only for spec.backend pytorch and transformers "
        "(with tensorrt the engine fixes it: set spec.target.build.maxSeqLen)",
        field_path=".runtime.maxSeqLen",
        check=lambda s: s.runtime.max_seq_len is None or s.backend != "tensorrt",
        reason="FieldValueForbidden",
    ),
    Rule["SpeculativeDeploymentSpec"](
        name="cpu-needs-transformers",
        cel="self.placement.device != 'cpu' || self.backend == 'transformers'",
        message="spec.placement.device cpu needs spec.backend transformers (TensorRT-LLM runs only on GPUs)",
        field_path=".placement.device",
        check=lambda s: s.placement.device != "cpu" or s.backend == "transformers",
    ),
    *_model_rules("target"),
    *_model_rules("draft"),
)


# --- smaller sections----------------------------------------------------------------------------------------


def _no_gpu_product_on_cpu(s: PlacementSpec) -> bool:
    return s.device != "cpu" or s.gpu_product is None


PLACEMENT_RULES: Rules = (
    Rule["PlacementSpec"](
        name="gpu-product-not-on-cpu",
        # `has(self.device)` guards the apiserver's check of spec.placement's `default: {}` (see rollout).
        cel="!has(self.device) || self.device != 'cpu' || !has(self.gpuProduct)",
        message="spec.placement.gpuProduct must not be set when spec.placement.device is cpu",
        field_path=".gpuProduct",
        check=_no_gpu_product_on_cpu,
        reason="FieldValueForbidden",
    ),
)


def _one_chat_template(s: ServingSpec) -> bool:
    return s.chat_template is None or s.chat_template_config_map is None


SERVING_RULES: Rules = (
    Rule["ServingSpec"](
        name="one-chat-template",
        cel="!has(self.chatTemplate) || !has(self.chatTemplateConfigMap)",
        message="spec.serving.chatTemplate and spec.serving.chatTemplateConfigMap are mutually exclusive",
        field_path=".chatTemplateConfigMap",
        check=_one_chat_template,
        reason="FieldValueForbidden",
    ),
)


def _one_cache_source(s: EngineCacheSpec) -> bool:
    return (s.pvc_name is None) != (s.size is None)


def _storage_class_with_size(s: EngineCacheSpec) -> bool:
    return s.storage_class_name is None or s.size is not None


ENGINE_CACHE_RULES: Rules = (
    Rule["EngineCacheSpec"](
        name="one-cache-source",
        cel="has(self.pvcName) != has(self.size)",
        message="spec.engineCache needs exactly one of spec.engineCache.pvcName (an existing claim) and "
        "spec.engineCache.size (a claim the operator creates)",
        field_path=".pvcName",
        check=_one_cache_source,
    ),
    Rule["EngineCacheSpec"](
        name="storage-class-needs-size",
        cel="!has(self.storageClassName) || has(self.size)",
        message="spec.engineCache.storageClassName needs spec.engineCache.size "
        "(it applies to the claim the operator creates)",
        field_path=".storageClassName",
        check=_storage_class_with_size,
        reason="FieldValueForbidden",
    ),
)


def _is_zero(value: int | str) -> bool:
    return value in (0, "0%")


def _zero_cel(expr: str) -> str:
    return f"(type({expr}) == int ? {expr} == 0 : {expr} == '0%')"


def _rollout_progresses(s: RolloutSpec) -> bool:
    return not (_is_zero(s.max_surge) and _is_zero(s.max_unavailable))


ROLLOUT_RULES: Rules = (
    Rule["RolloutSpec"](
        name="rollout-can-progress",
        # The guards matter only when the apiserver checks the `default: {}` of spec.rollout against this rule
        # (it does so without defaulting the fields inside); real objects always have both fields.
        cel="!has(self.maxSurge) || !has(self.maxUnavailable) || "
        f"!({_zero_cel('self.maxSurge')} && {_zero_cel('self.maxUnavailable')})",
        message="spec.rollout.maxSurge and spec.rollout.maxUnavailable must not both be 0",
        field_path=".maxUnavailable",
        check=_rollout_progresses,
    ),
)


def _min_within_max(s: AutoscalingSpec) -> bool:
    return s.min_replicas <= s.max_replicas


def _zero_needs_keda(s: AutoscalingSpec) -> bool:
    return s.min_replicas > 0 or s.engine == "keda"


def _keda_settings_need_keda(s: AutoscalingSpec) -> bool:
    return s.keda is None or s.engine == "keda"


AUTOSCALING_RULES: Rules = (
    Rule["AutoscalingSpec"](
        name="autoscaling-min-within-max",
        cel="self.minReplicas <= self.maxReplicas",
        message="spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas",
        field_path=".minReplicas",
        check=_min_within_max,
    ),
    Rule["AutoscalingSpec"](
        name="autoscaling-zero-needs-keda",
        cel="self.minReplicas > 0 || self.engine == 'keda'",
        message="spec.autoscaling.minReplicas 0 needs spec.autoscaling.engine keda "
        "(a HorizontalPodAutoscaler cannot scale to zero)",
        field_path=".minReplicas",
        check=_zero_needs_keda,
    ),
    Rule["AutoscalingSpec"](
        name="autoscaling-keda-settings-need-keda",
        cel="!has(self.keda) || self.engine == 'keda'",
        message="spec.autoscaling.keda is only used with spec.autoscaling.engine keda",
        field_path=".keda",
        check=_keda_settings_need_keda,
    ),
)
