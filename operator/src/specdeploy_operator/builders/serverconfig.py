"""The server configuration of a SpeculativeDeployment (`server.yaml`; its schema is the server's own
`specdeploy_server.config.ServerConfig`, docs/server.md), and the facts of the serving pod it refers to: mount
paths, the grace period it drains within, the CPU resources and threads of a CPU pod."""

from __future__ import annotations

import math
from typing import Any, Final

from specdeploy_operator.api import EngineRole, ModelSource, ModelSpec, SpeculativeDeployment

from .common import quantity_value
from .engines import engine_models
from .job import download_step
from .layout import MODELS_MOUNT, SOURCE_MOUNT, CacheLayout, served_source_mount
from .settings import OperatorSettings

__all__ = [
    "API_KEY_MOUNT",
    "CHAT_TEMPLATE_MOUNT",
    "MODELS_MOUNT",
    "PRESTOP_SECONDS",
    "build_server_config",
    "cpu_resources",
    "cpu_threads",
    "device_placement",
    "direct_sources",
    "grace_period",
    "shutdown_timeout",
]

API_KEY_MOUNT: Final = "/var/run/secrets/specdeploy/api-key"
CHAT_TEMPLATE_MOUNT: Final = "/etc/specdeploy/chat-template"
_BACKENDS: Final = {
    "tensorrt": "trtllm-engine",
    "pytorch": "trtllm-llmapi",
    "transformers": "pytorch-reference",
}
_SERVER_METHODS: Final = ("draftTarget", "promptLookup", "eagle3", "mtp", "none")

PRESTOP_SECONDS: Final = 5
"""The pod keeps taking requests this long after it is marked for deletion (a preStop sleep), while Services
and load balancers stop routing to it; only then does the server get SIGTERM and start draining."""
SHUTDOWN_MARGIN_SECONDS: Final = 5
"""The server finishes draining this long before the kubelet's SIGKILL (uvicorn's backstop, model unload)."""


def shutdown_timeout(sdep: SpeculativeDeployment, settings: OperatorSettings) -> int:
    """The server's `shutdownTimeoutSeconds`: what is left of the grace period after the preStop sleep and the
    margin (grace = preStop + drain + margin, docs/server.md)."""
    return max(grace_period(sdep, settings) - PRESTOP_SECONDS - SHUTDOWN_MARGIN_SECONDS, 1)


def grace_period(sdep: SpeculativeDeployment, settings: OperatorSettings) -> int:
    """`terminationGracePeriodSeconds` of the serving pods: the spec's, else the operator's."""
    grace = sdep.spec.serving.termination_grace_period_seconds
    return grace if grace is not None else settings.termination_grace_period_seconds


def device_placement(sdep: SpeculativeDeployment) -> tuple[list[int], list[int] | None]:
    """GPUs of a replica: (target device ids, draft device ids or None). The target takes devices
    0..TP*PP-1; a colocated draft shares the first draft-TP of them, a dedicated one takes the devices after
    the target's."""
    spec = sdep.spec
    target = list(range(spec.target.gpus))
    if spec.draft is None:
        return target, None
    draft_tp = spec.draft.tensor_parallel
    start = 0 if spec.placement.draft == "colocated" else spec.target.gpus
    return target, list(range(start, start + draft_tp))


def _engine_path(
    engines: dict[str, dict[str, Any]], role: EngineRole, settings: OperatorSettings
) -> str | None:
    engine = engines.get(role)
    if engine is None:
        return None
    return CacheLayout.of(settings).engine(engine["spec"]["cache"]["path"])


def _model_path(
    sdep: SpeculativeDeployment,
    role: EngineRole,
    model: ModelSpec,
    engines: dict[str, dict[str, Any]],
    settings: OperatorSettings,
) -> str:
    built = _engine_path(engines, role, settings)
    if built is not None:
        return built
    if sdep.spec.backend == "tensorrt":
        # Serving is rendered only once every engine exists; never fall back to the raw checkpoint.
        raise ValueError(f"no EngineBuild for the {role} engine: build the engines first")
    return _source_path(model.model, role)


def _source_path(source: ModelSource, role: str) -> str:
    """Where a checkpoint the pod loads directly is found: downloaded by an init container into
    `/models/<role>`, or mounted from its claim at `/models/source-<role>`."""
    _, path, _ = download_step(source, f"{MODELS_MOUNT}/{role}")
    return path.replace(SOURCE_MOUNT, served_source_mount(role), 1)


def direct_sources(sdep: SpeculativeDeployment, built: set[str]) -> list[tuple[str, ModelSource]]:
    """Checkpoints the serving pod loads as they are: models without an engine build, and the EAGLE-3
    draft head."""
    sources: list[tuple[str, ModelSource]] = [
        (role, model.model) for role, model in engine_models(sdep) if role not in built
    ]
    eagle = sdep.spec.speculative.eagle
    if sdep.spec.speculative.method == "eagle3" and eagle is not None:
        sources.append(("eagle", eagle.model))
    return sources


def build_server_config(
    sdep: SpeculativeDeployment,
    engines: list[dict[str, Any]],
    settings: OperatorSettings | None = None,
) -> dict[str, Any]:
    """The server configuration file (schema: docs/server.md, camelCase) for the deployment and its built
    engines (EngineBuild dicts, as `build_engine_builds` returns them)."""
    settings = settings or OperatorSettings()
    spec = sdep.spec
    by_role = {engine["spec"]["role"]: engine for engine in engines}
    model: dict[str, Any] = {"target": _model_path(sdep, "target", spec.target, by_role, settings)}
    if spec.draft is not None:
        model["draft"] = _model_path(sdep, "draft", spec.draft, by_role, settings)
    if spec.speculative.method == "eagle3" and spec.speculative.eagle is not None:
        model["speculativeModel"] = _source_path(spec.speculative.eagle.model, "eagle")
    if "target" in by_role and spec.backend == "tensorrt":
        model["tokenizer"] = CacheLayout.of(settings).tokenizer(by_role["target"]["spec"]["cache"]["path"])
    if spec.backend == "transformers" and spec.runtime.max_seq_len is not None:
        model["maxModelLen"] = spec.runtime.max_seq_len
    model["servedModelName"] = spec.target.model.uri.rstrip("/").rsplit("/", 1)[-1]
    speculative: dict[str, Any] = {
        "maxDraftLen": spec.speculative.max_draft_len,
        "draftLen": spec.speculative.effective_draft_len,
        "acceptance": spec.speculative.acceptance,
    }
    if spec.speculative.method in _SERVER_METHODS:
        speculative = {"method": spec.speculative.method, **speculative}
    if spec.speculative.disable_above_concurrency is not None:
        speculative["disableAboveConcurrency"] = spec.speculative.disable_above_concurrency
    if spec.speculative.prompt_lookup is not None:
        speculative["promptLookup"] = {
            "maxMatchingNgramSize": spec.speculative.prompt_lookup.max_matching_ngram_size
        }
    runtime: dict[str, Any] = {}
    rt = spec.runtime
    for key, value in (
        ("maxBatchSize", rt.max_batch_size),
        # Always written: 0 (also for unset) is "no limit" in the server as in TensorRT-LLM's executor, N > 0
        # a bound (503 beyond N waiting); the rendered file says it whatever the server's default.
        ("maxQueueSize", rt.max_queue_size or 0),
        ("maxNumTokens", rt.max_num_tokens),
        ("kvCacheFreeGpuMemFraction", rt.kv_cache_free_gpu_mem_fraction),
        ("draftKvCacheFreeGpuMemFraction", rt.draft_kv_cache_free_gpu_mem_fraction),
        ("enableKvCacheReuse", rt.enable_kv_cache_reuse),
        ("enableChunkedContext", rt.enable_chunked_context),
        ("guaranteedNoEvict", rt.guaranteed_no_evict),
        # The reference backend (transformers) takes the sequence limit as the model's context length.
        ("maxSeqLen", rt.max_seq_len if spec.backend != "transformers" else None),
        ("kvCacheHostMemoryMegabytes", rt.kv_cache_host_memory_megabytes),
        ("kvCacheOnboardBlocks", rt.kv_cache_onboard_blocks),
        ("enableBatchSizeTuning", rt.enable_batch_size_tuning),
        ("enableMaxNumTokensTuning", rt.enable_max_num_tokens_tuning),
        ("crossKvCacheFraction", rt.cross_kv_cache_fraction),
        ("secondaryOffloadMinPriority", rt.secondary_offload_min_priority),
        ("eventBufferMaxSize", rt.event_buffer_max_size),
    ):
        if value is not None:
            runtime[key] = value
    serving: dict[str, Any] = {
        "host": "0.0.0.0",
        "port": spec.serving.port,
        "shutdownTimeoutSeconds": shutdown_timeout(sdep, settings),
    }
    if spec.serving.api_key_secret:
        serving["apiKeyFile"] = f"{API_KEY_MOUNT}/api-key"
    if spec.serving.chat_template or spec.serving.chat_template_config_map:
        serving["chatTemplate"] = f"{CHAT_TEMPLATE_MOUNT}/template.jinja"
    return {
        "model": model,
        "backend": _BACKENDS[spec.backend],
        "speculative": speculative,
        "placement": _placement(sdep, settings),
        "runtime": runtime,
        "serving": serving,
        # One access-log line per request: `kubectl logs` shows what the pod served.
        "logging": {"level": "INFO", "format": "json", "accessLog": True},
    }


def cpu_resources(sdep: SpeculativeDeployment, settings: OperatorSettings) -> dict[str, Any]:
    """Container resources of a serving pod on CPUs (`spec.placement.device: cpu`): `spec.serving.resources`,
    else the operator's defaults."""
    if sdep.spec.serving.resources is not None:
        return sdep.spec.serving.resources.to_dict()
    return {
        "limits": {"memory": settings.cpu_serving_memory_limit},
        "requests": {"cpu": settings.cpu_serving_cpu_request, "memory": settings.cpu_serving_memory_request},
    }


def cpu_threads(resources: dict[str, Any]) -> int:
    """torch threads of a server on CPUs: its CPU limit, else its CPU request, rounded up; at least 1."""
    cpu = (resources.get("limits") or {}).get("cpu")
    if cpu is None:
        cpu = (resources.get("requests") or {}).get("cpu")
    if cpu is None:
        return 1
    return max(1, math.ceil(quantity_value(cpu)))


def _placement(sdep: SpeculativeDeployment, settings: OperatorSettings) -> dict[str, Any]:
    if sdep.spec.placement.device == "cpu":
        return {"device": "cpu", "cpuThreads": cpu_threads(cpu_resources(sdep, settings))}
    target_ids, draft_ids = device_placement(sdep)
    placement: dict[str, Any] = {"device": "cuda", "targetDeviceIds": target_ids}
    if draft_ids is not None:
        placement["draftDeviceIds"] = draft_ids
    return placement
