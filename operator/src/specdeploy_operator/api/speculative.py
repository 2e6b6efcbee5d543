"""The SpeculativeDeployment API (`specdeploy.dev/v1alpha1`, kind `SpeculativeDeployment`).

Field names are the public contract. Docstrings below each field become the CRD's descriptions (what
`kubectl explain sdep.spec...` prints) and the text of `docs/api.md`; cross-field rules live in `rules.py`.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Final, Literal

from pydantic import Field, PlainValidator, StringConstraints, WithJsonSchema
from pydantic_core import PydanticCustomError

from . import rules
from .autoscaling import AutoscalingSpec
from .base import GROUP, VERSION, ApiModel, PrinterColumn, ResourceInfo, Rules
from .checkpoint import ModelSource, QuantizationSpec
from .enginebuild import EngineBuildPhase
from .meta import (
    CONDITIONS_LIST_EXTRAS,
    DNS_1035_LABEL,
    Affinity,
    Condition,
    ConfigMapKeyRef,
    DnsSubdomain,
    LabelValue,
    ObjectMeta,
    PercentOrCount,
    QualifiedName,
    Quantity,
    ResourceRequirements,
    SelectorValue,
    Toleration,
)
from .podsecurity import PodSecuritySpec

__all__ = [
    "AutoscalerRef",
    "Backend",
    "BuildSpec",
    "ConditionType",
    "Device",
    "EagleSpec",
    "EngineCacheSpec",
    "EngineRef",
    "EngineRefs",
    "ImagesSpec",
    "ModelSpec",
    "Phase",
    "PlacementSpec",
    "PromptLookupSpec",
    "RolloutSpec",
    "RuntimeSpec",
    "ServingSpec",
    "SpeculationFigures",
    "SpeculativeDeployment",
    "SpeculativeDeploymentSpec",
    "SpeculativeDeploymentStatus",
    "SpeculativeMethod",
    "SpeculativeSpec",
]

Backend = Literal["tensorrt", "pytorch", "transformers"]
Device = Literal["gpu", "cpu"]
SpeculativeMethod = Literal["draftTarget", "promptLookup", "eagle3", "mtp", "none"]
Phase = Literal["Pending", "Building", "Deploying", "Ready", "Degraded", "Failed"]
EnableDisable = Literal["enable", "disable"]


class ConditionType:
    """Condition types of `SpeculativeDeployment.status.conditions`."""

    ENGINES_READY: Final = "EnginesReady"
    AVAILABLE: Final = "Available"
    PROGRESSING: Final = "Progressing"
    DEGRADED: Final = "Degraded"


_NoSpace = Annotated[str, StringConstraints(pattern=r"^\S+$", min_length=1, max_length=512)]
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


# --- speculation---------------------------------------------------------------------------------------------


def _draft_len(value: object) -> int | str:
    # bool is an int in Python but not a draft length; the apiserver's int-or-string rejects it too.
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 64:
        return value
    if value == "auto":
        return "auto"
    raise PydanticCustomError("draft_len", "must be an integer from 1 to 64 or 'auto'")


DraftLen = Annotated[
    int | Literal["auto"],
    PlainValidator(_draft_len),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": "^auto$",
            "minimum": 1,
            "maximum": 64,
        }
    ),
]
"""A draft length: an integer from 1 to 64, or `auto`."""


class PromptLookupSpec(ApiModel):
    """Prompt-lookup (n-gram) drafting settings."""

    max_matching_ngram_size: Annotated[int, Field(ge=1, le=32)] = 2
    """Longest n-gram from the end of the text that is searched for in the prompt and output so far
    (`max_matching_ngram_size`)."""


class EagleSpec(ApiModel):
    """EAGLE-3 drafting settings."""

    model: ModelSource
    """The EAGLE-3 draft head checkpoint (`speculative_model_dir`), trained for the target model."""


class SpeculativeSpec(ApiModel):
    """Which speculative decoding method runs, and how many tokens it proposes."""

    validation_rules: ClassVar[Rules] = rules.SPECULATIVE_RULES

    method: SpeculativeMethod
    """`draftTarget`: a separate draft model proposes tokens (needs `spec.draft`). `promptLookup`: tokens are
    copied from matching n-grams of the prompt and output. `eagle3` / `mtp`: a draft head or multi-token
    prediction layers (backend `pytorch` only). `none`: plain decoding, the baseline for A/B comparisons."""
    draft_len: DraftLen | None = None
    """Tokens proposed per step (`draft_len`, `prompt_lookup_num_tokens`), at most `maxDraftLen`; or `auto`,
    also what unset means: per step and per sequence the server chooses the draft length (0 to `maxDraftLen`)
    that maximises the whole batch's expected tokens per second, from step costs it measures at the current
    batch size and each sequence's acceptance, so speculation fades out as load makes verification
    compute-bound (docs/server.md). With backend `pytorch` TensorRT-LLM drafts `maxDraftLen` and turns
    speculation off for good when acceptance stays below 10 % (docs/trtllm.md)."""
    disable_above_concurrency: Annotated[int, Field(ge=1, le=65536)] | None = None
    """A hard rule on top of the draft length: in a step with more than this many concurrent sequences nobody
    drafts (TensorRT-LLM's `max_concurrency` with backend `pytorch`). Unset: no such rule."""
    max_draft_len: Annotated[int, Field(ge=1, le=64)] = 10
    """Most draft tokens the engine accepts per step: the target engine's `--max_draft_len`, or
    `max_draft_len` of the PyTorch backend's `speculative_config`."""
    acceptance: Literal["tokenMatch", "logits"] = "tokenMatch"
    """How draft tokens are accepted: `tokenMatch` compares tokens with the target's; `logits` uses rejection
    sampling on draft and target logits (`use_logits`), `draftTarget` with backend `tensorrt` or
    `transformers` only (with `pytorch`, TensorRT-LLM's LLM API decides acceptance itself)."""
    prompt_lookup: PromptLookupSpec | None = None
    """Settings of `promptLookup`; only with that method."""
    eagle: EagleSpec | None = None
    """Settings of `eagle3`; required with that method, forbidden otherwise."""

    @property
    def effective_draft_len(self) -> int | Literal["auto"]:
        """Tokens proposed per step, or `auto` (also the default)."""
        return "auto" if self.draft_len is None else self.draft_len


# --- placement, runtime, serving-----------------------------------------------------------------------------


class PlacementSpec(ApiModel):
    """Where the pods run and how the draft shares GPUs with the target."""

    validation_rules: ClassVar[Rules] = rules.PLACEMENT_RULES

    device: Device = "gpu"
    """`gpu`: each replica requests `spec.placement.gpuResource` GPUs on a node of `gpuProduct`, tolerating
    the GPU taint. `cpu` (backend `transformers` only): no GPU request, GPU product label or GPU toleration;
    the server runs on the CPU cores of `spec.serving.resources`, for clusters and tests without GPUs."""
    draft: Literal["colocated", "dedicated"] = "colocated"
    """`colocated`: the draft's executors share the target's GPUs (seed 000: TP2 70B + TP2 8B run four
    executors on two GPUs). `dedicated`: the draft gets GPUs of its own (seed 001: draft on GPU 0, target on
    GPU 1)."""
    gpu_product: LabelValue | None = None
    """GPU model to run on, matched against the node label `nvidia.com/gpu.product`, e.g.
    `NVIDIA-H100-80GB-HBM3` or `NVIDIA-H200`. Engines are built for this product. Unset: the operator's
    default product with `device: gpu`; must stay unset with `device: cpu`."""
    gpu_resource: QualifiedName = "nvidia.com/gpu"
    """Extended resource name that GPUs are requested as."""
    gpus_per_node: Annotated[int, Field(ge=1, le=64)] = 8
    """GPUs per node of the target pool; a replica (all its GPUs on one node) may not need more."""
    node_selector: Annotated[dict[str, SelectorValue], Field(max_length=64)] | None = None
    """Extra node labels the pods require, added to the GPU product label (with `device: gpu`)."""
    tolerations: Annotated[list[Toleration], Field(max_length=32)] | None = None
    """Tolerations added to the pods (GPU node taints, dedicated pools)."""
    affinity: Affinity | None = None
    """Extra affinity rules added to the pods."""
    priority_class_name: DnsSubdomain | None = None
    """PriorityClass of the pods."""


_Fraction = Annotated[float, Field(gt=0, le=1)]


class RuntimeSpec(ApiModel):
    """Executor settings, the seed's `runtime.json` in camelCase; unset fields keep TensorRT-LLM defaults."""

    max_batch_size: Annotated[int, Field(ge=1, le=65536)] | None = None
    """Most requests the executor batches together (`max_batch_size`); the engine's limit still applies."""
    max_num_tokens: Annotated[int, Field(ge=1, le=16777216)] | None = None
    """Most tokens per executor step (`max_num_tokens`)."""
    max_queue_size: Annotated[int, Field(ge=0)] | None = None
    """Most requests waiting for a batch slot beyond the `maxBatchSize` running ones (`max_queue_size`). 0 or
    unset: no limit, as in TensorRT-LLM's executor (`Executor::Impl::enqueueRequests` rejects only when
    `maxQueueSize > 0`; cpp/tensorrt_llm/executor/executorImpl.cpp) and llgtrt (`runtime.json` default 0), so
    a burst waits and the queue is visible to autoscaling. A positive number N asks for a bound: the server
    answers 503 (`queue_full`, `Retry-After: 1`) to a request that would make more than N wait."""
    max_seq_len: Annotated[int, Field(ge=2, le=16777216)] | None = None
    """Longest sequence in tokens, prompt and output together, at least 2 (one of each); backends `pytorch`
    and `transformers` (the server's `maxModelLen`; unset: the target's `max_position_embeddings`). With
    `tensorrt` the engine fixes it: `build.maxSeqLen`."""
    guaranteed_no_evict: bool | None = None
    """Schedule only requests whose KV cache is guaranteed to fit (`GUARANTEED_NO_EVICT`) instead of
    maximising utilisation (`guaranteed_no_evict`)."""
    enable_chunked_context: bool | None = None
    """Split long prompts into chunks across steps (`enable_chunked_context`)."""
    enable_kv_cache_reuse: bool = True
    """Reuse KV cache blocks of shared prefixes (`enable_kv_cache_reuse`, `--kv_cache_enable_block_reuse`);
    must be true for `draftTarget` and `promptLookup`, which re-send the whole prefix every step."""
    kv_cache_free_gpu_mem_fraction: _Fraction | None = None
    """Fraction of free GPU memory the target's KV cache takes after the weights are loaded
    (`kv_cache_free_gpu_mem_fraction`), in (0, 1]."""
    draft_kv_cache_free_gpu_mem_fraction: _Fraction | None = None
    """Same for the draft model's executor, in (0, 1]; only with `spec.draft`."""
    kv_cache_host_memory_megabytes: Annotated[int, Field(ge=0)] | None = None
    """Host memory for offloaded KV cache blocks, in MiB (`kv_cache_host_memory_megabytes`)."""
    kv_cache_onboard_blocks: bool | None = None
    """Copy offloaded blocks back to the GPU before use (`kv_cache_onboard_blocks`)."""
    enable_batch_size_tuning: bool | None = None
    """Let the executor tune the batch size at run time (`enable_batch_size_tuning`)."""
    enable_max_num_tokens_tuning: bool | None = None
    """Let the executor tune the token budget at run time (`enable_max_num_tokens_tuning`)."""
    cross_kv_cache_fraction: _Fraction | None = None
    """Share of the KV cache for cross attention, encoder-decoder models only (`cross_kv_cache_fraction`)."""
    secondary_offload_min_priority: Annotated[int, Field(ge=0, le=100)] | None = None
    """Lowest block priority that is offloaded to host memory (`secondary_offload_min_priority`)."""
    event_buffer_max_size: Annotated[int, Field(ge=0)] | None = None
    """Size of the KV cache event buffer (`event_buffer_max_size`); 0 turns events off."""


class ServingSpec(ApiModel):
    """The OpenAI-compatible HTTP server in front of the executors."""

    validation_rules: ClassVar[Rules] = rules.SERVING_RULES

    port: Annotated[int, Field(ge=1, le=65535)] = 8000
    """Container and Service port; the endpoint is `http://<service>.<namespace>.svc:<port>/v1`."""
    api_key_secret: DnsSubdomain | None = None
    """Name of a Secret whose `api-key` key holds the bearer token clients must send; unset means no auth."""
    chat_template: Annotated[str, StringConstraints(min_length=1, max_length=65536)] | None = None
    """Jinja chat template, inline; overrides the tokenizer's. Exclusive with `chatTemplateConfigMap`."""
    chat_template_config_map: ConfigMapKeyRef | None = None
    """ConfigMap key holding the chat template. Exclusive with `chatTemplate`."""
    resources: ResourceRequirements | None = None
    """CPU and memory of the server container; GPUs follow from the models' parallelism. With
    `spec.placement.device: cpu` unset means the operator's defaults (`SPECDEPLOY_CPU_SERVING_*`: requests 1
    CPU and 1Gi, limit 2Gi), and the CPU limit (else the request), rounded up, is the server's thread
    count."""
    termination_grace_period_seconds: Annotated[int, Field(ge=15, le=86400)] | None = None
    """Seconds a stopping pod (scale-down, rollout, node drain) gets: 5 s still serving while endpoints are
    updated (a preStop sleep), then the server stops taking requests (SIGTERM) and drains the in-flight ones
    for up to this minus 10 s, ending the rest with `finish_reason: abort`. Unset: the operator's
    `SPECDEPLOY_TERMINATION_GRACE_PERIOD_SECONDS` (60)."""


class EngineCacheSpec(ApiModel):
    """Shared storage for built engines (and the staged checkpoints of backend `transformers`), keyed by
    EngineBuild hash so identical builds are reused."""

    validation_rules: ClassVar[Rules] = rules.ENGINE_CACHE_RULES

    pvc_name: DnsSubdomain | None = None
    """An existing ReadWriteMany PersistentVolumeClaim. Exclusive with `size`."""
    storage_class_name: DnsSubdomain | None = None
    """StorageClass of the claim the operator creates; only with `size` (unset: the cluster default)."""
    size: Quantity | None = None
    """Size of the claim the operator creates, e.g. `2Ti`. Exclusive with `pvcName`."""


class ImagesSpec(ApiModel):
    """Container images; unset ones come from the operator's configuration."""

    server: _NoSpace | None = None
    """Image of the inference server (TensorRT-LLM runtime plus the specdeploy server)."""
    builder: _NoSpace | None = None
    """Image of the download, quantize and engine build Jobs; it pins the TensorRT-LLM version."""


class RolloutSpec(ApiModel):
    """How pods are replaced on a change (Deployment rolling update)."""

    validation_rules: ClassVar[Rules] = rules.ROLLOUT_RULES

    max_surge: PercentOrCount = 0
    """Pods created above `replicas` during a rollout (count or percentage). 0 by default: GPUs are scarce,
    and a surge pod can wait forever for a GPU the old pod holds."""
    max_unavailable: PercentOrCount = 1
    """Pods that may be missing during a rollout (count or percentage)."""


# --- the resource -------------------------------------------------------------------------------------------


class SpeculativeDeploymentSpec(ApiModel):
    """Desired state: a target model served with a speculative decoding method on GPU (or CPU) nodes."""

    validation_rules: ClassVar[Rules] = rules.SPEC_RULES

    replicas: Annotated[int, Field(ge=0, le=1024)] = 1
    """Number of serving replicas; each runs the target (and the draft) on the GPUs (or CPUs) of one node."""
    backend: Backend = "tensorrt"
    """`tensorrt`: engines built with `trtllm-build` and run by paired executors (seeds 000, 001, 003, 004).
    `pytorch`: the TensorRT-LLM LLM API with a `speculative_config`, no engine build (seed 002).
    `transformers`: Hugging Face checkpoints run by the specdeploy server's own speculative loop on the
    transformers reference backend, on a GPU or (with `spec.placement.device: cpu`) on CPUs; methods
    `draftTarget`, `promptLookup` and `none`, no quantization, no engine build (the checkpoint is staged
    into the engine cache, or mounted for `pvc://`). For development, CPU clusters and GPUs without
    TensorRT-LLM; not the fast path: no TensorRT-LLM kernels, no in-flight batching of the TensorRT-LLM
    executor."""
    target: ModelSpec
    """The model whose output is served."""
    draft: ModelSpec | None = None
    """The draft model; required with `spec.speculative.method: draftTarget`, forbidden otherwise. It must
    share the target's tokenizer."""
    speculative: SpeculativeSpec
    """Speculative decoding method and draft lengths."""
    placement: PlacementSpec = Field(default_factory=PlacementSpec, json_schema_extra={"default": {}})
    """Device (GPU or CPU), GPU product, draft placement and pod scheduling."""
    runtime: RuntimeSpec = Field(default_factory=RuntimeSpec, json_schema_extra={"default": {}})
    """Executor settings (the seed's `runtime.json`)."""
    serving: ServingSpec = Field(default_factory=ServingSpec, json_schema_extra={"default": {}})
    """HTTP server settings."""
    engine_cache: EngineCacheSpec | None = None
    """Where engines are stored; unset uses the operator's default cache."""
    images: ImagesSpec | None = None
    """Image overrides."""
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, json_schema_extra={"default": {}})
    """Rolling update limits."""
    autoscaling: AutoscalingSpec | None = None
    """Horizontal autoscaling; unset: `replicas` is fixed."""
    pod_security: PodSecuritySpec | None = None
    """Security context of the serving and build pods; unset: the defaults, which pass the `restricted`
    Pod Security Standard (non-root user 10001, read-only root filesystem, no capabilities)."""

    @property
    def gpus_per_replica(self) -> int:
        """GPUs one replica requests: the target's, plus the draft's when it is placed on dedicated GPUs; 0 on
        CPUs."""
        if self.placement.device == "cpu":
            return 0
        gpus = self.target.gpus
        if self.draft is not None and self.placement.draft == "dedicated":
            gpus += self.draft.gpus
        return gpus


class EngineRef(ApiModel):
    """The EngineBuild a model of this deployment uses."""

    name: DnsSubdomain
    """Name of the EngineBuild."""
    hash: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,64}$")]
    """Content hash of the engine (the EngineBuild's `spec.hash`)."""
    phase: EngineBuildPhase
    """Phase of the EngineBuild."""


class EngineRefs(ApiModel):
    """Engines of the target and the draft."""

    target: EngineRef | None = None
    """Engine of the target model."""
    draft: EngineRef | None = None
    """Engine of the draft model."""
    previous: Annotated[list[DnsSubdomain], Field(max_length=32)] | None = None
    """EngineBuilds this deployment used before, newest first, kept for rollback (the operator's
    `keepPreviousEngines` per model); other unreferenced EngineBuilds are deleted after the grace period."""


class AutoscalerRef(ApiModel):
    """The autoscaler the operator created for `spec.autoscaling`, and what it last reported."""

    kind: Literal["HorizontalPodAutoscaler", "ScaledObject"]
    """`HorizontalPodAutoscaler` (`engine: hpa`) or `ScaledObject` (`engine: keda`)."""
    name: DnsSubdomain
    """Its name (the deployment's)."""
    metric: Annotated[str, StringConstraints(max_length=128)] | None = None
    """The metric it scales on, as the custom metrics API names it."""
    target: Annotated[str, StringConstraints(max_length=64)] | None = None
    """Average value per replica it aims for (a quantity)."""
    desired_replicas: Annotated[int, Field(ge=0)] | None = None
    """Replicas it last asked for (HPA only)."""
    message: Annotated[str, StringConstraints(max_length=1024)] | None = None
    """Why it cannot scale, when it cannot (its `ScalingActive`/`AbleToScale` condition, or the error of
    creating it)."""


class SpeculationFigures(ApiModel):
    """How speculation pays off, from the ready servers' own metrics over the last window (counter deltas of
    `specdeploy_draft_tokens`, `specdeploy_accepted_draft_tokens`, `specdeploy_speculative_steps` and
    `specdeploy_generation_tokens`, summed over the pods that were scraped at both ends of the window)."""

    acceptance_rate: Annotated[float, Field(ge=0, le=1)] | None = None
    """Accepted draft tokens ÷ drafted tokens; unset when nothing was drafted (method `none`)."""
    tokens_per_step: Annotated[float, Field(ge=0)] | None = None
    """Mean tokens a sequence gains per target step (1 without speculation)."""
    draft_length: Annotated[float, Field(ge=0)] | None = None
    """Mean draft tokens proposed per sequence step (the draft length in use, averaged)."""
    speculating_fraction: Annotated[float, Field(ge=0, le=1)] | None = None
    """Fraction of sequence steps that proposed at least one draft token, where the servers export it
    (`specdeploy_speculating_steps`)."""
    tokens_per_second: Annotated[float, Field(ge=0)] | None = None
    """Generated tokens per second, all ready pods together."""
    window_seconds: Annotated[float, Field(ge=0)] | None = None
    """Length of the window the figures cover."""
    measured_at: Annotated[str, StringConstraints(max_length=64)] | None = None
    """When the window ended (RFC 3339)."""
    pods: Annotated[int, Field(ge=0)] | None = None
    """Pods the figures cover."""
    pods_skipped: Annotated[int, Field(ge=0)] | None = None
    """Ready pods that could not be scraped or restarted within the window (not in the figures)."""


class SpeculativeDeploymentStatus(ApiModel):
    """Observed state, written by the operator."""

    phase: Phase | None = None
    """Summary: `Pending`, `Building` (engines), `Deploying` (pods starting), `Ready`, `Degraded`, `Failed`.
    """
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The `metadata.generation` this status describes."""
    conditions: (
        Annotated[list[Condition], Field(max_length=16, json_schema_extra=CONDITIONS_LIST_EXTRAS)] | None
    ) = None
    """Conditions `EnginesReady`, `Available`, `Progressing`, `Degraded`, `Synced` and, once speculation
    has been measured, `SpeculationEffective` (`False`, reason `LowAcceptance`, when the draft's tokens are
    mostly rejected)."""
    engines: EngineRefs | None = None
    """EngineBuilds in use."""
    replicas: Annotated[int, Field(ge=0)] | None = None
    """Pods that exist (scale subresource)."""
    ready_replicas: Annotated[int, Field(ge=0)] | None = None
    """Pods that are ready to serve."""
    updated_replicas: Annotated[int, Field(ge=0)] | None = None
    """Pods running the current spec."""
    ready_text: Annotated[str, StringConstraints(max_length=32)] | None = None
    """`readyReplicas/replicas`, as `kubectl get` shows it (printer columns cannot compute)."""
    selector: Annotated[str, StringConstraints(max_length=4096)] | None = None
    """Label selector of the pods, as a string (scale subresource, HPA)."""
    endpoint: Annotated[str, StringConstraints(max_length=512)] | None = None
    """OpenAI-compatible base URL, `http://<service>.<namespace>.svc:<port>/v1`."""
    gpus_per_replica: Annotated[int, Field(ge=0)] | None = None
    """GPUs each replica requests."""
    capacity_pending_replicas: Annotated[int, Field(ge=0)] | None = None
    """Replicas waiting for GPU capacity (pending because no node has the free GPUs; a cluster autoscaler
    adds nodes for them); unset when none wait."""
    autoscaler: AutoscalerRef | None = None
    """The autoscaler of `spec.autoscaling`; unset without one."""
    speculation: SpeculationFigures | None = None
    """Acceptance and throughput measured on the ready pods (updated at most once per
    `SPECDEPLOY_SPECULATION_INTERVAL_SECONDS`, only when they change meaningfully, never while idle); unset
    until a window with traffic has been measured."""


SPECULATIVE_DEPLOYMENT = ResourceInfo(
    group=GROUP,
    version=VERSION,
    kind="SpeculativeDeployment",
    plural="speculativedeployments",
    singular="speculativedeployment",
    short_names=("sdep", "specdeploy"),
    printer_columns=(
        PrinterColumn("Phase", "string", ".status.phase", "Summary of the deployment's state"),
        PrinterColumn("Method", "string", ".spec.speculative.method", "Speculative decoding method"),
        PrinterColumn("Target", "string", ".spec.target.model.uri", "Target model"),
        PrinterColumn("Draft", "string", ".spec.draft.model.uri", "Draft model"),
        PrinterColumn("Ready", "string", ".status.readyText", "Ready replicas / replicas"),
        PrinterColumn(
            "Acceptance",
            "number",
            ".status.speculation.acceptanceRate",
            "Accepted / drafted tokens, last window",
        ),
        PrinterColumn(
            "Tokens/step",
            "number",
            ".status.speculation.tokensPerStep",
            "Tokens per target step, last window",
        ),
        PrinterColumn("GPUs/replica", "integer", ".status.gpusPerReplica", "GPUs each replica requests"),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation"),
        PrinterColumn("Backend", "string", ".spec.backend", "Inference backend", priority=1),
        PrinterColumn("Endpoint", "string", ".status.endpoint", "OpenAI-compatible base URL", priority=1),
    ),
    scale=(".spec.replicas", ".status.replicas", ".status.selector"),
    # The Service carries the deployment's name, so it must be a DNS-1035 label.
    name_max_length=63,
    name_pattern=DNS_1035_LABEL,
)


class SpeculativeDeployment(ApiModel):
    """Serves an LLM with speculative decoding: a target model plus a draft model, prompt lookup, EAGLE-3 or
    MTP, on GPU nodes (or CPU nodes, backend `transformers`), behind an OpenAI-compatible endpoint. The
    operator builds the engines (EngineBuild objects), then runs the replicas."""

    resource: ClassVar[ResourceInfo] = SPECULATIVE_DEPLOYMENT

    api_version: Literal["specdeploy.dev/v1alpha1"] = "specdeploy.dev/v1alpha1"
    """`specdeploy.dev/v1alpha1`."""
    kind: Literal["SpeculativeDeployment"] = "SpeculativeDeployment"
    """`SpeculativeDeployment`."""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    """Standard object metadata."""
    spec: SpeculativeDeploymentSpec
    """Desired state."""
    status: SpeculativeDeploymentStatus | None = None
    """Observed state."""
