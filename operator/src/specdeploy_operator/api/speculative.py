"""The SpeculativeDeployment API (`specdeploy.dev/v1alpha1`, kind `SpeculativeDeployment`): the resource, its
spec (`spec.py` and the section modules it is built from) and status (`status.py`), re-exported here.

Field names are the public contract. Docstrings below each field become the CRD's descriptions (what
`kubectl explain sdep.spec...` prints) and the text of `docs/api.md`; cross-field rules sit next to the types
they check."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from .base import GROUP, VERSION, ApiModel, PrinterColumn, ResourceInfo
from .conditions import ConditionType
from .meta import DNS_1035_LABEL, ObjectMeta
from .modelspec import BuildSpec, ModelSpec
from .placement import Device, PlacementSpec
from .serving import EngineCacheSpec, EnvVar, ImagesSpec, RolloutSpec, RuntimeSpec, ServingSpec
from .spec import Backend, SpeculativeDeploymentSpec
from .speculation import EagleSpec, PromptLookupSpec, SpeculativeMethod, SpeculativeSpec
from .status import (
    AutoscalerRef,
    EngineRef,
    EngineRefs,
    Phase,
    SpeculationFigures,
    SpeculativeDeploymentStatus,
)

__all__ = [
    "SPECULATIVE_DEPLOYMENT",
    "AutoscalerRef",
    "Backend",
    "BuildSpec",
    "ConditionType",
    "Device",
    "EagleSpec",
    "EngineCacheSpec",
    "EngineRef",
    "EngineRefs",
    "EnvVar",
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
        PrinterColumn("Model", "string", ".status.modelName", "Name clients send as `model`", priority=1),
        PrinterColumn(
            "Nodes/replica",
            "integer",
            ".status.nodesPerReplica",
            "Nodes a replica spans, when several",
            priority=1,
        ),
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
