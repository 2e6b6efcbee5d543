"""The EngineBuild API (`specdeploy.dev/v1alpha1`, kind `EngineBuild`).

One content-addressed TensorRT-LLM engine for one model (or, for backend `transformers`, one staged
checkpoint): the unit of caching and reuse. The operator creates
EngineBuilds from SpeculativeDeployments (several deployments with the same model, quantization, parallelism,
flags, builder image and GPU product share one); users only read them. The spec is immutable.
"""

from __future__ import annotations

import hashlib
import json
from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from .base import GROUP, VERSION, ApiModel, PrinterColumn, ResourceInfo, Rule, Rules
from .checkpoint import ModelSource, QuantizationSpec
from .conditions import EngineBuildPhase
from .meta import (
    CONDITIONS_LIST_EXTRAS,
    Condition,
    DnsSubdomain,
    LabelValue,
    ObjectMeta,
    QualifiedName,
    Toleration,
)
from .podsecurity import PodSecuritySpec

__all__ = [
    "ENGINE_BUILD",
    "EngineBuild",
    "EngineBuildPhase",
    "EngineBuildSpec",
    "EngineBuildStatus",
    "EngineCacheLocation",
    "EngineRole",
    "Parallelism",
]

EngineRole = Literal["target", "draft"]


class Parallelism(ApiModel):
    """How the engine is split across GPUs; fixed at checkpoint conversion."""

    tensor_parallel: Annotated[int, Field(ge=1, le=64)] = 1
    """Tensor-parallel degree (`--tp_size`)."""
    pipeline_parallel: Annotated[int, Field(ge=1, le=64)] = 1
    """Pipeline-parallel degree (`--pp_size`)."""


class EngineCacheLocation(ApiModel):
    """Where the built engine is stored."""

    pvc_name: DnsSubdomain
    """PersistentVolumeClaim of the engine cache."""
    path: Annotated[str, StringConstraints(pattern=r"^[^\s]+$", min_length=1, max_length=1024)]
    """Directory of the engine inside the claim (`config.json` plus one `rank<N>.engine` per rank, or the
    staged checkpoint)."""


class EngineBuildSpec(ApiModel):
    """What to build. Written by the operator; immutable, because the object is addressed by `hash`."""

    validation_rules: ClassVar[Rules] = (
        Rule(
            name="engine-build-spec-immutable",
            cel="self == oldSelf",
            message="spec is immutable: an EngineBuild is addressed by spec.hash; "
            "create a new EngineBuild instead",
            field_path=".hash",
            check=None,
        ),
    )

    model: ModelSource
    """The checkpoint."""
    role: EngineRole
    """Whether the engine serves as `target` or `draft` (the target of draft-token methods gets
    `--speculative_decoding_mode draft_tokens_external`)."""
    parallelism: Parallelism = Field(default_factory=Parallelism, json_schema_extra={"default": {}})
    """Tensor and pipeline parallelism."""
    quantization: QuantizationSpec
    """Checkpoint conversion and quantization."""
    build_flags: Annotated[
        list[Annotated[str, StringConstraints(min_length=1, max_length=256)]], Field(max_length=128)
    ]
    """The rendered `trtllm-build` arguments, without `--checkpoint_dir`, `--output_dir` and `--workers`;
    empty when no engine is built (a quantized or staged checkpoint)."""
    stage_only: bool | None = None
    """`true`: the checkpoint is only staged, downloaded as it is into the cache directory, for backend
    `transformers` (no conversion, no build, no GPU). Unset: converted or quantized, then built into an engine
    when `buildFlags` is not empty."""
    hash: Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{16,64}$")]
    """Content hash over model, revision, role, parallelism, quantization, build flags, staging, builder
    image, GPU product, cache claim and pod security (when set), not over credentials, pull secrets,
    ServiceAccount or scheduling: the engine's identity, computed by the
    operator (`EngineBuildSpec.content_hash()`)."""
    builder_image: Annotated[str, StringConstraints(pattern=r"^\S+$", min_length=1, max_length=512)]
    """Image that runs the build; it pins the TensorRT-LLM version."""
    gpu_product: LabelValue | None = None
    """GPU product the engine is built on and for (node label `nvidia.com/gpu.product`); unset for a staged
    checkpoint, whose Job needs no GPU."""
    gpu_resource: QualifiedName | None = None
    """Extended resource the build pod requests its GPUs as (the deployment's `placement.gpuResource`, e.g.
    `nvidia.com/mig-3g.40gb`); unset means `nvidia.com/gpu`. Where to build, not what: not in the hash."""
    build_gpus: Annotated[int, Field(ge=1, le=64)] | None = None
    """GPUs the build pod requests when a node has fewer than the parallelism needs (a model that spans
    nodes): its checkpoint is quantized for every rank on one node's GPUs. Unset: tensor x pipeline
    parallel. Where the build runs, not what it makes: not in the hash."""
    tolerations: Annotated[list[Toleration], Field(max_length=32)] | None = None
    """Tolerations of the build pod besides the GPU taint's (the deployment's `placement.tolerations`); not in
    the hash. An engine shared by several deployments is scheduled as the first of them asked."""
    cache: EngineCacheLocation
    """Where the engine is stored."""
    pod_security: PodSecuritySpec | None = None
    """Security context of the build pod: the `spec.podSecurity` of the deployment that asked for the engine;
    unset: the defaults. Part of the hash when set, since the user and group own the files it writes."""
    image_pull_secrets: Annotated[list[DnsSubdomain], Field(max_length=32)] | None = None
    """`imagePullSecrets` of the build pod: the operator's default ones, then the deployment's
    `spec.images.pullSecrets`. Not in the hash: how the builder image is pulled does not change the engine."""
    service_account_name: DnsSubdomain | None = None
    """ServiceAccount of the build pod (the deployment's `spec.serviceAccounts.build`, else the operator's
    default); unset: the namespace's `default`. Not in the hash: who reads the checkpoint does not change
    the engine."""

    def content_hash(self) -> str:
        """The hash this spec should carry: SHA-256 over everything that changes the engine, 16 hex digits."""
        content = self.to_dict()
        content.pop("hash", None)
        # The claim is part of the identity (an engine in another cache is another artifact); the path
        # inside it is derived from the hash.
        content["cache"].pop("path", None)
        # The credentials secret does not change the bytes of the engine.
        content["model"].pop("credentialsSecret", None)
        # Where the build runs does not change the engine either (the product does, and is kept).
        content.pop("gpuResource", None)
        content.pop("buildGpus", None)
        content.pop("tolerations", None)
        # Nor do the credentials the pod pulls its image and reads its checkpoint with.
        content.pop("imagePullSecrets", None)
        content.pop("serviceAccountName", None)
        canonical = json.dumps(content, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


class EngineBuildStatus(ApiModel):
    """Progress of the build, written by the operator."""

    phase: EngineBuildPhase | None = None
    """`Pending` (waiting for a GPU or the cache), `Running` (download, quantize, build), `Succeeded` (engine
    or staged checkpoint in the cache) or `Failed` (out of retries)."""
    job_name: DnsSubdomain | None = None
    """Name of the current or last build Job."""
    attempts: Annotated[int, Field(ge=0)] | None = None
    """Build attempts so far."""
    start_time: Annotated[datetime, Field(strict=False)] | None = None
    """When the current attempt started."""
    completion_time: Annotated[datetime, Field(strict=False)] | None = None
    """When the build succeeded or finally failed."""
    message: Annotated[str, StringConstraints(max_length=32768)] | None = None
    """Human-readable detail, e.g. the last lines of a failed build's log."""
    conditions: (
        Annotated[list[Condition], Field(max_length=16, json_schema_extra=CONDITIONS_LIST_EXTRAS)] | None
    ) = None
    """Standard conditions (`Succeeded`, `Failed`)."""


ENGINE_BUILD = ResourceInfo(
    group=GROUP,
    version=VERSION,
    kind="EngineBuild",
    plural="enginebuilds",
    singular="enginebuild",
    short_names=("eb",),
    printer_columns=(
        PrinterColumn("Model", "string", ".spec.model.uri", "Checkpoint"),
        PrinterColumn("Role", "string", ".spec.role", "target or draft"),
        PrinterColumn("TP", "integer", ".spec.parallelism.tensorParallel", "Tensor-parallel degree"),
        PrinterColumn("Phase", "string", ".status.phase", "Build phase"),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp", "Time since creation"),
        PrinterColumn("GPU", "string", ".spec.gpuProduct", "GPU product", priority=1),
        PrinterColumn("Hash", "string", ".spec.hash", "Content hash", priority=1),
    ),
)


class EngineBuild(ApiModel):
    """One TensorRT-LLM engine for one model (or a staged checkpoint, backend `transformers`),
    content-addressed by `spec.hash` and shared by every SpeculativeDeployment that needs the same engine.
    Created by the operator; read-only for users."""

    resource: ClassVar[ResourceInfo] = ENGINE_BUILD

    api_version: Literal["specdeploy.dev/v1alpha1"] = "specdeploy.dev/v1alpha1"
    """`specdeploy.dev/v1alpha1`."""
    kind: Literal["EngineBuild"] = "EngineBuild"
    """`EngineBuild`."""
    metadata: ObjectMeta = Field(default_factory=ObjectMeta)
    """Standard object metadata."""
    spec: EngineBuildSpec
    """What to build."""
    status: EngineBuildStatus | None = None
    """Build progress."""
