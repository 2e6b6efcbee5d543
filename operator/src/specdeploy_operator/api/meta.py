"""Kubernetes building blocks used inside specdeploy objects: object metadata, conditions, ConfigMap keys and
container resources; the value types (`values.py`) and scheduling types (`scheduling.py`) are re-exported
here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from .base import ApiModel
from .scheduling import (
    NODE_SELECTOR_REQUIREMENT_RULES,
    TOLERATION_RULES,
    Affinity,
    LabelSelector,
    LabelSelectorRequirement,
    NodeAffinity,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    PodAffinity,
    PodAffinityTerm,
    PodAntiAffinity,
    PreferredSchedulingTerm,
    Toleration,
    WeightedPodAffinityTerm,
)
from .values import (
    DNS_1035_LABEL,
    DNS_1123_LABEL,
    DNS_1123_SUBDOMAIN,
    QUALIFIED_NAME,
    DnsSubdomain,
    LabelValue,
    PercentOrCount,
    QualifiedName,
    Quantity,
    SelectorValue,
)

__all__ = [
    "DNS_1035_LABEL",
    "DNS_1123_LABEL",
    "DNS_1123_SUBDOMAIN",
    "NODE_SELECTOR_REQUIREMENT_RULES",
    "TOLERATION_RULES",
    "Affinity",
    "Condition",
    "ConfigMapKeyRef",
    "DnsSubdomain",
    "LabelSelector",
    "LabelSelectorRequirement",
    "LabelValue",
    "NodeAffinity",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "ObjectMeta",
    "PercentOrCount",
    "PodAffinity",
    "PodAffinityTerm",
    "PodAntiAffinity",
    "PreferredSchedulingTerm",
    "QualifiedName",
    "Quantity",
    "ResourceList",
    "ResourceRequirements",
    "SelectorValue",
    "Toleration",
    "WeightedPodAffinityTerm",
]

# --- metadata and status-------------------------------------------------------------------------------------


class ObjectMeta(BaseModel):
    """The part of `metadata` that offline validation looks at; everything else is passed through."""

    model_config = ConfigDict(extra="allow")

    name: str | None = None
    generate_name: str | None = Field(default=None, alias="generateName")
    namespace: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None


class Condition(ApiModel):
    """One aspect of the object's state, in the standard Kubernetes condition shape."""

    type: Annotated[str, StringConstraints(pattern=QUALIFIED_NAME, max_length=316)]
    """Condition type in CamelCase, e.g. `Available`, `Progressing`, `EnginesReady`, `Degraded`."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds: `True`, `False` or `Unknown`."""
    observed_generation: Annotated[int, Field(ge=0)] | None = None
    """The `metadata.generation` this condition was computed for."""
    last_transition_time: Annotated[datetime, Field(strict=False)]
    """When the condition last changed status (RFC 3339)."""
    reason: Annotated[
        str,
        StringConstraints(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", min_length=1, max_length=1024),
    ]
    """Machine-readable CamelCase reason for the last transition."""
    message: Annotated[str, StringConstraints(max_length=32768)]
    """Human-readable details about the last transition."""


CONDITIONS_LIST_EXTRAS: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}
"""Schema extras that make a `conditions` list a map keyed by `type` (server-side apply merges by type)."""


class ConfigMapKeyRef(ApiModel):
    """A key of a ConfigMap in the object's namespace."""

    name: DnsSubdomain
    """Name of the ConfigMap."""
    key: Annotated[str, StringConstraints(pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)] = "chat_template.j2"
    """Key inside the ConfigMap."""


# --- resources ---------------------------------------------------------------------------------------------


class ResourceList(ApiModel):
    """CPU, memory and ephemeral storage amounts. GPUs are not set here: they follow from the parallelism."""

    cpu: Quantity | None = None
    """CPU cores, e.g. `8` or `500m`."""
    memory: Quantity | None = None
    """Memory in bytes, e.g. `64Gi`."""
    ephemeral_storage: Quantity | None = Field(default=None, alias="ephemeral-storage")
    """Local scratch space, e.g. `20Gi`."""


class ResourceRequirements(ApiModel):
    """Requests and limits for a container, as in a Pod spec but restricted to CPU, memory and storage."""

    requests: ResourceList | None = None
    """Amounts the scheduler reserves for the container."""
    limits: ResourceList | None = None
    """Amounts the container may not exceed."""
