"""The server configuration of a SpeculativeDeployment (`server.yaml`; its schema is the server's own
`specdeploy_server.config.ServerConfig`, docs/server.md) and the ConfigMap that holds it. Every path in it is
the serving pod's (`pod.py`): the configuration says what the pod holds, it does not decide it."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

from specdeploy_operator.api import EngineBuild, SpeculativeDeployment, SpeculativeSpec

from .common import SERVER_COMPONENT, child_metadata, configmap_name
from .engines import engine_builds_of
from .layout import MODELS_MOUNT
from .measured import MEASURED_FILE, measured_costs, measured_costs_file
from .pod import (
    API_KEY_MOUNT,
    CHAT_TEMPLATE_FILE,
    CHAT_TEMPLATE_MOUNT,
    CONFIG_FILE,
    PRESTOP_SECONDS,
    ServingPod,
    cpu_resources,
    cpu_threads,
    grace_period,
    serving_pod,
    shutdown_timeout,
)
from .settings import OperatorSettings

__all__ = [
    "API_KEY_MOUNT",
    "CHAT_TEMPLATE_MOUNT",
    "CONFIG_FILE",
    "MODELS_MOUNT",
    "PRESTOP_SECONDS",
    "build_configmap",
    "build_server_config",
    "config_digest",
    "configmap_for",
    "cpu_resources",
    "cpu_threads",
    "device_placement",
    "grace_period",
    "server_config",
    "shutdown_timeout",
]

_BACKENDS: Final = {
    "tensorrt": "trtllm-engine",
    "pytorch": "trtllm-llmapi",
    "transformers": "pytorch-reference",
}


def method_settings(speculative: SpeculativeSpec) -> dict[str, Any]:
    """Each method's settings in the server's words (docs/server.md): the same names, camelCase, the models
    left out (they are `model.speculativeModel`)."""
    out: dict[str, Any] = {}
    for key, settings in (
        ("promptLookup", speculative.prompt_lookup),
        ("ngram", speculative.ngram),
        ("suffixAutomaton", speculative.suffix_automaton),
        ("pard", speculative.pard),
        ("dflash", speculative.dflash),
    ):
        if settings is not None:
            out[key] = settings.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"model"})
    return out


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


def server_config(sdep: SpeculativeDeployment, pod: ServingPod, settings: OperatorSettings) -> dict[str, Any]:
    """The server configuration file (schema: docs/server.md, camelCase) of the deployment's serving pod."""
    spec = sdep.spec
    paths = pod.paths
    model: dict[str, Any] = {"target": paths.target}
    if paths.draft is not None:
        model["draft"] = paths.draft
    if paths.speculative_model is not None:
        model["speculativeModel"] = paths.speculative_model
    if paths.tokenizer is not None:
        model["tokenizer"] = paths.tokenizer
    if spec.backend == "transformers" and spec.runtime.max_seq_len is not None:
        model["maxModelLen"] = spec.runtime.max_seq_len
    name, *aliases = spec.served_model_names
    model["servedModelName"] = name
    if aliases:
        model["servedModelAliases"] = aliases
    speculative: dict[str, Any] = {
        "maxDraftLen": spec.speculative.max_draft_len,
        "draftLen": spec.speculative.effective_draft_len,
        "acceptance": spec.speculative.acceptance,
    }
    speculative = {"method": spec.speculative.method, **speculative}
    if spec.speculative.disable_above_concurrency is not None:
        speculative["disableAboveConcurrency"] = spec.speculative.disable_above_concurrency
    if (measured := measured_costs_file(sdep)) is not None:
        speculative["measuredCostsFile"] = measured
    speculative.update(method_settings(spec.speculative))
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
    if pod.api_key_file is not None:
        serving["apiKeyFile"] = pod.api_key_file
    if pod.chat_template_file is not None:
        serving["chatTemplate"] = pod.chat_template_file
    if spec.serving.unknown_fields is not None:
        serving["unknownFields"] = spec.serving.unknown_fields
    return {
        "model": model,
        "backend": _BACKENDS[spec.backend],
        "speculative": speculative,
        "placement": _placement(sdep, pod),
        "runtime": runtime,
        "serving": serving,
        # One access-log line per request: `kubectl logs` shows what the pod served.
        "logging": {"level": "INFO", "format": "json", "accessLog": True},
    }


def _placement(sdep: SpeculativeDeployment, pod: ServingPod) -> dict[str, Any]:
    if sdep.spec.placement.device == "cpu":
        return {"device": "cpu", "cpuThreads": cpu_threads(pod.resources)}
    target_ids, draft_ids = device_placement(sdep)
    placement: dict[str, Any] = {"device": "cuda", "targetDeviceIds": target_ids}
    if draft_ids is not None:
        placement["draftDeviceIds"] = draft_ids
    return placement


def build_server_config(
    sdep: SpeculativeDeployment,
    engines: Sequence[EngineBuild | Mapping[str, Any]],
    settings: OperatorSettings | None = None,
) -> dict[str, Any]:
    """The server configuration for the deployment and its built `engines` (models or wire objects)."""
    settings = settings or OperatorSettings()
    return server_config(sdep, serving_pod(sdep, engine_builds_of(engines), settings), settings)


def config_digest(configmap: Mapping[str, Any]) -> str:
    """The digest of a server ConfigMap's data: the pod template carries it, so a changed configuration (or
    inline chat template) rolls the pods. Measured costs (measured.py) are left out: they reach the pods that
    start later and restart none."""
    data = configmap["data"]
    content = json.dumps(json.loads(data[CONFIG_FILE]), sort_keys=True)
    if CHAT_TEMPLATE_FILE in data:
        content += "\x00" + data[CHAT_TEMPLATE_FILE]
    for key in sorted(set(data) - {CONFIG_FILE, CHAT_TEMPLATE_FILE, MEASURED_FILE}):  # launch scripts
        content += f"\x00{key}\x00{data[key]}"
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def configmap_for(
    sdep: SpeculativeDeployment, config: Mapping[str, Any], scripts: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """ConfigMap holding the server configuration `config` (`server.yaml`, JSON, which is valid YAML), the
    inline chat template when there is one, the launch `scripts` of a replica that spans nodes, and the
    measured costs its server starts from (measured.py)."""
    data = {CONFIG_FILE: json.dumps(config, indent=2, sort_keys=True) + "\n"}
    if sdep.spec.serving.chat_template:
        data[CHAT_TEMPLATE_FILE] = sdep.spec.serving.chat_template
    if (measured := measured_costs(sdep)) is not None:
        data[MEASURED_FILE] = measured
    data.update(scripts or {})
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(sdep, SERVER_COMPONENT, configmap_name(sdep)),
        "data": data,
    }


def build_configmap(
    sdep: SpeculativeDeployment,
    engines: Sequence[EngineBuild | Mapping[str, Any]],
    settings: OperatorSettings | None = None,
) -> dict[str, Any]:
    """The server ConfigMap for the deployment and its built `engines`."""
    return configmap_for(sdep, build_server_config(sdep, engines, settings))
