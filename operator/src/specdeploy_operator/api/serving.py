"""How a SpeculativeDeployment's replicas run and roll: executor settings (`spec.runtime`), the HTTP server
(`spec.serving`), the engine cache (`spec.engineCache`), images (`spec.images`) and rolling updates
(`spec.rollout`), with their cross-field rules."""

from __future__ import annotations

import json
from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from .base import ApiModel, Rule, Rules
from .meta import ConfigMapKeyRef, DnsSubdomain, PercentOrCount, Quantity, ResourceRequirements
from .trtllm import VERSION_PATTERN

__all__ = [
    "ENGINE_CACHE_RULES",
    "ROLLOUT_RULES",
    "SERVING_RULES",
    "EngineCacheSpec",
    "EnvVar",
    "ImagesSpec",
    "RolloutSpec",
    "RuntimeSpec",
    "ServingSpec",
]

_NoSpace = Annotated[str, StringConstraints(pattern=r"^\S+$", min_length=1, max_length=512)]

_Fraction = Annotated[float, Field(gt=0, le=1)]

ModelName = Annotated[str, StringConstraints(pattern=r"^\S+$", min_length=1, max_length=256)]
"""A name clients send in a request's `model` field."""


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


#: environment the operator sets on serving containers from other fields (`spec.placement.multiNode.nccl`)
OPERATOR_ENV = ("NCCL_SOCKET_IFNAME", "NCCL_IB_DISABLE")


class EnvVar(ApiModel):
    """An environment variable of the server container."""

    name: Annotated[
        str, StringConstraints(pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$", min_length=1, max_length=256)
    ]
    """Its name (letters, digits, `_`, `-`, `.`; not starting with a digit)."""
    value: Annotated[str, StringConstraints(max_length=32768)] = ""
    """Its value."""


def _one_chat_template(s: ServingSpec) -> bool:
    return s.chat_template is None or s.chat_template_config_map is None


def _env_names_unique(s: ServingSpec) -> bool:
    names = [e.name for e in s.env or ()]
    return len(names) == len(set(names))


def _env_not_operators(s: ServingSpec) -> bool:
    return not any(e.name in OPERATOR_ENV for e in s.env or ())


def _aliases_distinct(s: ServingSpec) -> bool:
    aliases = s.model_aliases or []
    return len(aliases) == len(set(aliases)) and s.model_name not in aliases


SERVING_RULES: Rules = (
    Rule["ServingSpec"](
        name="model-aliases-distinct",
        cel="!has(self.modelAliases) || self.modelAliases.all(a, self.modelAliases.exists_one(b, b == a) "
        "&& (!has(self.modelName) || a != self.modelName))",
        message="spec.serving.modelAliases names each alias once, none equal to spec.serving.modelName",
        field_path=".modelAliases",
        check=_aliases_distinct,
    ),
    Rule["ServingSpec"](
        name="one-chat-template",
        cel="!has(self.chatTemplate) || !has(self.chatTemplateConfigMap)",
        message="spec.serving.chatTemplate and spec.serving.chatTemplateConfigMap are mutually exclusive",
        field_path=".chatTemplateConfigMap",
        check=_one_chat_template,
        reason="FieldValueForbidden",
    ),
    Rule["ServingSpec"](
        name="env-names-unique",
        cel="!has(self.env) || self.env.all(e, self.env.exists_one(f, f.name == e.name))",
        message="spec.serving.env names each variable once",
        field_path=".env",
        check=_env_names_unique,
    ),
    Rule["ServingSpec"](
        name="env-not-the-operators",
        cel=f"!has(self.env) || self.env.all(e, !(e.name in {json.dumps(list(OPERATOR_ENV))}))",
        message="spec.serving.env cannot set " + " or ".join(OPERATOR_ENV) + ": they come from "
        "spec.placement.multiNode.nccl",
        field_path=".env",
        check=_env_not_operators,
        reason="FieldValueForbidden",
    ),
)


class ServingSpec(ApiModel):
    """The OpenAI-compatible HTTP server in front of the executors."""

    validation_rules: ClassVar[Rules] = SERVING_RULES

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
    env: Annotated[list[EnvVar], Field(max_length=64)] | None = None
    """Environment variables of the server container (on a replica that spans nodes, of every rank), e.g.
    TensorRT-LLM's `TLLM_WORKER_USE_SINGLE_PROCESS` (docs/trtllm.md). The operator's own
    (`NCCL_SOCKET_IFNAME`, `NCCL_IB_DISABLE`, from `spec.placement.multiNode.nccl`) are refused."""
    model_name: ModelName | None = None
    """The model name clients send (`model` in a request) and every response, `/v1/models` and the metrics'
    `model` label carry. Unset: the target's Hugging Face id for `hf://org/name` (`org/name`, as vLLM and
    trtllm-serve name a model; `name` is accepted too, as earlier releases served it), else the last
    segment of its URI. `status.modelName` holds it (`kubectl get sdep -o wide`)."""
    model_aliases: Annotated[list[ModelName], Field(max_length=16)] | None = None
    """Other names a request may send for the same model (answered under `modelName`), e.g. a short name;
    each distinct, none equal to `modelName`."""
    unknown_fields: Literal["warn", "refuse"] | None = None
    """What the server does with request fields it does not know (docs/server.md): `warn` serves the request
    and logs their names (unset means this), `refuse` answers 400 naming the first, as OpenAI does."""


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


class EngineCacheSpec(ApiModel):
    """Shared storage for built engines (and the staged checkpoints of backend `transformers`), keyed by
    EngineBuild hash so identical builds are reused."""

    validation_rules: ClassVar[Rules] = ENGINE_CACHE_RULES

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
    trtllm_version: Annotated[str, Field(pattern=VERSION_PATTERN, max_length=32)] | None = None
    """The TensorRT-LLM release in `server` (e.g. `1.3.0rc14`), which admission holds each method's first
    release against; unset: the release of the operator's default image for the backend
    (docs/trtllm.md#supported-versions)."""
    pull_secrets: Annotated[list[DnsSubdomain], Field(max_length=16)] | None = None
    """Secrets (`kubernetes.io/dockerconfigjson`, in the deployment's namespace) of every pod the operator
    creates for this deployment: serving, build and staging pods (`imagePullSecrets`), after the operator's
    default ones (`SPECDEPLOY_IMAGE_PULL_SECRETS`). Not part of the engine hash: how an image is pulled does
    not change what it builds."""


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


class RolloutSpec(ApiModel):
    """How pods are replaced on a change (Deployment rolling update)."""

    validation_rules: ClassVar[Rules] = ROLLOUT_RULES

    max_surge: PercentOrCount = 0
    """Pods created above `replicas` during a rollout (count or percentage). 0 by default: GPUs are scarce,
    and a surge pod can wait forever for a GPU the old pod holds."""
    max_unavailable: PercentOrCount = 1
    """Pods that may be missing during a rollout (count or percentage)."""
