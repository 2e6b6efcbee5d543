"""Operator settings: one pydantic model, read from `SPECDEPLOY_*` environment variables (the chart sets
them).

`OperatorSettings.from_env(environ)` takes the mapping as an argument, so builders and tests never read the
process environment themselves."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field

from specdeploy_operator.api.trtllm import RELEASES

__all__ = ["ENV_PREFIX", "OperatorSettings"]

ENV_PREFIX: Final = "SPECDEPLOY_"
_EMPTY_IS_UNSET: Final = (
    "cache_storage_class_name",
    "serving_service_account",
    "build_service_account",
    "builder_image",
)
"""Settings whose empty variable means unset (the chart renders every setting, unset ones as "")."""


class OperatorSettings(BaseModel):
    """Defaults the operator applies where a SpeculativeDeployment leaves something unset."""

    model_config = ConfigDict(frozen=True, extra="forbid", use_attribute_docstrings=True)

    server_image: str = "ghcr.io/specdeploy/server:0.1.0"
    """Serving image of backends `pytorch` and `transformers` (`SPECDEPLOY_SERVER_IMAGE`) unless
    `spec.images.server` is set: on the `PYTORCH` release of trtllm-releases.env."""
    engine_server_image: str = f"ghcr.io/specdeploy/server:0.1.0-trtllm{RELEASES.tensorrt}"
    """Serving image of backend `tensorrt` (`SPECDEPLOY_ENGINE_SERVER_IMAGE`) unless `spec.images.server` is
    set: on the `TENSORRT` release, with quantize.py and trtllm-build."""
    builder_image: str | None = None
    """Image of build and staging Jobs (`SPECDEPLOY_BUILDER_IMAGE`) unless `spec.images.builder` is set;
    unset: the deployment's serving image, so the release that runs an engine builds it."""
    trainer_image: str = "ghcr.io/specdeploy/trainer:0.1.0"
    """Image of a DraftTraining's EAGLE-3 train Job (`SPECDEPLOY_TRAINER_IMAGE`): NVIDIA ModelOpt, pinned
    (Dockerfile.trainer). Its generate Job and a `draftModel` train Job run the server image."""
    image_pull_secrets: tuple[str, ...] = ()
    """`imagePullSecrets` of every pod the operator creates (serving, build, staging), comma-separated
    (`SPECDEPLOY_IMAGE_PULL_SECRETS`); a deployment's `spec.images.pullSecrets` come after these. Each
    Secret must exist in the deployment's namespace."""
    serving_service_account: str | None = None
    """ServiceAccount of serving pods unless `spec.serviceAccounts.serving` is set
    (`SPECDEPLOY_SERVING_SERVICE_ACCOUNT`); unset: the namespace's `default`."""
    build_service_account: str | None = None
    """ServiceAccount of build and staging pods unless `spec.serviceAccounts.build` is set
    (`SPECDEPLOY_BUILD_SERVICE_ACCOUNT`); unset: the namespace's `default`."""
    cache_pvc_name: str = "specdeploy-engine-cache"
    """Engine-cache claim used when `spec.engineCache` is unset (`SPECDEPLOY_CACHE_PVC_NAME`)."""
    cache_storage_class_name: str | None = None
    """StorageClass of claims the operator creates (`SPECDEPLOY_CACHE_STORAGE_CLASS_NAME`)."""
    cache_size: str = "1Ti"
    """Size of claims the operator creates (`SPECDEPLOY_CACHE_SIZE`)."""
    cache_mount_path: str = "/cache"
    """Where the engine cache is mounted in build and serving pods (`SPECDEPLOY_CACHE_MOUNT_PATH`)."""
    default_gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    """GPU product when `spec.placement.gpuProduct` is unset (`SPECDEPLOY_DEFAULT_GPU_PRODUCT`)."""
    gc_grace_seconds: Annotated[int, Field(ge=0)] = 3600
    """How long an unreferenced EngineBuild is kept (`SPECDEPLOY_GC_GRACE_SECONDS`)."""
    keep_previous_engines: Annotated[int, Field(ge=0, le=16)] = 1
    """Previous engines kept per deployment and model role for rollback, 0 to 16
    (`SPECDEPLOY_KEEP_PREVIOUS_ENGINES`; `status.engines.previous` holds at most 32 names)."""
    watch_namespaces: tuple[str, ...] = ()
    """Namespaces to watch, comma-separated (`SPECDEPLOY_WATCH_NAMESPACES`); empty means all."""
    build_backoff_limit: Annotated[int, Field(ge=0)] = 3
    """`backoffLimit` of build Jobs (`SPECDEPLOY_BUILD_BACKOFF_LIMIT`)."""
    build_ttl_seconds: Annotated[int, Field(ge=0)] = 86400
    """`ttlSecondsAfterFinished` of build Jobs (`SPECDEPLOY_BUILD_TTL_SECONDS`)."""
    quantize_script: str = "/opt/TensorRT-LLM-examples/quantization/quantize.py"
    """TensorRT-LLM `quantize.py` inside the builder image, backend `tensorrt` (`SPECDEPLOY_QUANTIZE_SCRIPT`);
    `pytorch` runs the image's `specdeploy-quantize`."""
    convert_script: str = "/opt/TensorRT-LLM-examples/llama/convert_checkpoint.py"
    """`convert_checkpoint.py` used for `format: none` (`SPECDEPLOY_CONVERT_SCRIPT`)."""
    python: str = "python"
    """Interpreter that runs the scripts in the builder image (`SPECDEPLOY_PYTHON`)."""
    termination_grace_period_seconds: Annotated[int, Field(ge=15)] = 60
    """Grace period of serving pods (`SPECDEPLOY_TERMINATION_GRACE_PERIOD_SECONDS`)."""
    startup_timeout_seconds: Annotated[int, Field(ge=10)] = 1800
    """How long a serving pod may take to load its engines before it is restarted
    (`SPECDEPLOY_STARTUP_TIMEOUT_SECONDS`)."""
    resync_seconds: Annotated[float, Field(gt=0)] = 300.0
    """How often the operator looks at every object again, as a safety net for missed events
    (`SPECDEPLOY_RESYNC_SECONDS`); costs no API request when nothing changed."""
    workers: Annotated[int, Field(ge=1, le=256)] = 8
    """Objects reconciled concurrently (`SPECDEPLOY_WORKERS`)."""
    prometheus_url: str = "http://prometheus-operated.monitoring.svc:9090"
    """Prometheus that KEDA ScaledObjects query when `spec.autoscaling.keda.serverAddress` is unset
    (`SPECDEPLOY_PROMETHEUS_URL`); the default is the Service the Prometheus Operator creates."""
    peering_lifetime_seconds: Annotated[int, Field(ge=5, le=3600)] = 60
    """With several replicas (`--peering`): how long a replica's peering record lives without renewal, so how
    long a standby waits before it takes over from an active replica that died
    (`SPECDEPLOY_PEERING_LIFETIME_SECONDS`)."""
    speculation_interval_seconds: Annotated[float, Field(ge=0)] = 30.0
    """How often the operator scrapes the ready serving pods' `/metrics` for `status.speculation`, which is
    written at most once per interval per deployment (`SPECDEPLOY_SPECULATION_INTERVAL_SECONDS`); 0 turns
    the figures off."""
    low_acceptance_rate: Annotated[float, Field(ge=0, le=1)] = 0.2
    """Below this acceptance rate over a window with drafting, condition `SpeculationEffective` turns
    `False` (reason `LowAcceptance`) with a Warning event (`SPECDEPLOY_LOW_ACCEPTANCE_RATE`)."""
    shm_size: str = "16Gi"
    """Size limit of the memory-backed `/dev/shm` of serving pods (`SPECDEPLOY_SHM_SIZE`)."""
    cpu_serving_cpu_request: str = "1"
    """CPU request of serving pods with `spec.placement.device: cpu` and no `spec.serving.resources`
    (`SPECDEPLOY_CPU_SERVING_CPU_REQUEST`); it is also the server's thread count then."""
    cpu_serving_memory_request: str = "1Gi"
    """Memory request of those pods (`SPECDEPLOY_CPU_SERVING_MEMORY_REQUEST`)."""
    cpu_serving_memory_limit: str = "2Gi"
    """Memory limit of those pods (`SPECDEPLOY_CPU_SERVING_MEMORY_LIMIT`)."""

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> OperatorSettings:
        """Settings from `SPECDEPLOY_<FIELD>` variables of `environ`; unknown `SPECDEPLOY_*` names are ignored
        (other tools share the prefix)."""
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw is None:
                continue
            if name in ("watch_namespaces", "image_pull_secrets"):
                values[name] = tuple(part.strip() for part in raw.split(",") if part.strip())
            elif name in _EMPTY_IS_UNSET and raw == "":
                values[name] = None
            else:
                values[name] = raw
        return cls.model_validate(values)
