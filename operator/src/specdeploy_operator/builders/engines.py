"""EngineBuilds of a SpeculativeDeployment: one per model that needs a build (or, for backend `transformers`,
a staged download), content-addressed by hash. They stay `EngineBuild` models through the builders (the Job,
the serving pod and the server configuration read them as such); `build_engine_builds` gives their wire form,
and `engine_build` turns a wire or live object into the model."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from specdeploy_operator.api import (
    EngineBuild,
    EngineBuildSpec,
    EngineCacheLocation,
    EngineRole,
    ModelSpec,
    ObjectMeta,
    Parallelism,
    SpeculativeDeployment,
    render_build_flags,
)

from .claims import cache_pvc_name
from .common import (
    ENGINE_HASH_LABEL,
    ENGINE_ROLE_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    dns_label,
)
from .identity import build_service_account, pull_secrets
from .layout import builder_image, engine_dir
from .scheduling import DEFAULT_GPU_RESOURCE
from .settings import OperatorSettings

__all__ = [
    "build_engine_builds",
    "cache_pvc_name",
    "engine_build",
    "engine_build_name",
    "engine_builds",
    "engine_builds_of",
    "engine_models",
    "gpu_product",
    "is_staged",
    "needs_build",
]

_HASH_PLACEHOLDER: Final = "0" * 16


def engine_models(sdep: SpeculativeDeployment) -> list[tuple[EngineRole, ModelSpec]]:
    """The models of the deployment in build order: the target, then the draft when there is one."""
    spec = sdep.spec
    models: list[tuple[EngineRole, ModelSpec]] = [("target", spec.target)]
    if spec.draft is not None:
        models.append(("draft", spec.draft))
    return models


def needs_build(sdep: SpeculativeDeployment, model: ModelSpec) -> bool:
    """Backend `tensorrt` always builds an engine; `pytorch` only produces a quantized checkpoint when
    quantization is asked for; `transformers` stages every checkpoint that is not on a claim already
    (`pvc://` is mounted into the serving pods as it is)."""
    if sdep.spec.backend == "tensorrt":
        return True
    if is_staged(sdep):
        return not model.model.uri.startswith("pvc://")
    quantization = model.quantization
    return quantization.format != "none" or quantization.kv_cache_dtype != "auto"


def is_staged(sdep: SpeculativeDeployment) -> bool:
    """Whether the deployment's EngineBuilds only stage checkpoints (backend `transformers`)."""
    return sdep.spec.backend == "transformers"


def gpu_product(sdep: SpeculativeDeployment, settings: OperatorSettings) -> str:
    """The GPU product the deployment runs (and its engines are built) on."""
    return sdep.spec.placement.gpu_product or settings.default_gpu_product


def engine_build_name(model_uri: str, role: EngineRole, hash_: str) -> str:
    """`<model>-<role>-<hash>`: the last path segment of the URI, shortened so the name stays a DNS-1123
    label of at most 63 characters; the hash keeps it unique."""
    model_name = model_uri.rstrip("/").rsplit("/", 1)[-1]
    return dns_label(model_name, f"{role}-{hash_}")


def _engine_build(
    sdep: SpeculativeDeployment, role: EngineRole, model: ModelSpec, settings: OperatorSettings
) -> EngineBuild:
    spec = sdep.spec
    flags = render_build_flags(spec, role) if spec.backend == "tensorrt" else []
    staged = is_staged(sdep)
    per_node = spec.placement.gpus_per_node
    draft = EngineBuildSpec(
        model=model.model,
        role=role,
        parallelism=Parallelism(
            tensor_parallel=model.tensor_parallel, pipeline_parallel=model.pipeline_parallel
        ),
        quantization=model.quantization,
        build_flags=flags,
        stage_only=True if staged else None,
        hash=_HASH_PLACEHOLDER,
        builder_image=builder_image(sdep, settings),
        # A staged checkpoint is the same on every device: its Job needs no GPU, and GPU and CPU deployments
        # share it.
        gpu_product=None if staged else gpu_product(sdep, settings),
        gpu_resource=None
        if staged or spec.placement.gpu_resource == DEFAULT_GPU_RESOURCE
        else spec.placement.gpu_resource,
        build_gpus=None if staged or model.gpus <= per_node else per_node,
        tolerations=None if staged else spec.placement.tolerations,
        cache=EngineCacheLocation(pvc_name=cache_pvc_name(sdep, settings), path="pending"),
        pod_security=spec.pod_security,
        image_pull_secrets=pull_secrets(sdep, settings) or None,
        service_account_name=build_service_account(sdep, settings),
    )
    hash_ = draft.content_hash()
    engine_spec = draft.model_copy(
        update={"hash": hash_, "cache": draft.cache.model_copy(update={"path": engine_dir(hash_)})}
    )
    meta = ObjectMeta(
        name=engine_build_name(model.model.uri, role, hash_),
        namespace=sdep.metadata.namespace or None,
        labels={
            NAME_LABEL: "specdeploy",
            MANAGED_BY_LABEL: MANAGED_BY,
            ENGINE_ROLE_LABEL: role,
            ENGINE_HASH_LABEL: hash_,
        },
    )
    return EngineBuild(metadata=meta, spec=engine_spec)


def engine_builds(sdep: SpeculativeDeployment, settings: OperatorSettings | None = None) -> list[EngineBuild]:
    """The EngineBuilds the deployment needs, target first. Shared between deployments: they carry no owner
    reference (unreferenced ones are garbage-collected after the grace period)."""
    settings = settings or OperatorSettings()
    return [
        _engine_build(sdep, role, model, settings)
        for role, model in engine_models(sdep)
        if needs_build(sdep, model)
    ]


def build_engine_builds(
    sdep: SpeculativeDeployment, settings: OperatorSettings | None = None
) -> list[dict[str, Any]]:
    """`engine_builds` in wire form (the objects `specdeploy render` prints and the operator creates)."""
    return [engine.to_dict() for engine in engine_builds(sdep, settings)]


def engine_build(obj: EngineBuild | Mapping[str, Any]) -> EngineBuild:
    """An EngineBuild as the model: `obj` itself, or a wire or live object read into it (its status, which the
    builders never read, is left out)."""
    if isinstance(obj, EngineBuild):
        return obj
    return EngineBuild.model_validate(
        {k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in obj}
    )


def engine_builds_of(engines: Sequence[EngineBuild | Mapping[str, Any]]) -> list[EngineBuild]:
    """`engine_build` of each of `engines`."""
    return [engine_build(engine) for engine in engines]
