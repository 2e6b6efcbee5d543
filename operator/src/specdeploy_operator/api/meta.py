"""Kubernetes building blocks used inside specdeploy objects: names, quantities, conditions, scheduling types.

These are typed (not `x-kubernetes-preserve-unknown-fields`) so that the apiserver rejects typos inside
`spec.placement.affinity` as it does everywhere else, and so `kubectl explain` can describe every field.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, StringConstraints, WithJsonSchema
from pydantic_core import PydanticCustomError

from .base import ApiModel, Rule, Rules

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

DNS_1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS_1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

DnsSubdomain = Annotated[str, StringConstraints(pattern=DNS_1123_SUBDOMAIN, min_length=1, max_length=253)]
"""A Kubernetes object name (Secret, ConfigMap, PVC, PriorityClass, StorageClass)."""
QualifiedName = Annotated[str, StringConstraints(pattern=_QUALIFIED_NAME, min_length=1, max_length=316)]
"""A label key or extended resource name, such as `nvidia.com/gpu.product`."""
LabelValue = Annotated[str, StringConstraints(pattern=_LABEL_VALUE, min_length=1, max_length=63)]
"""A non-empty label value, such as `NVIDIA-H100-80GB-HBM3`."""
SelectorValue = Annotated[str, StringConstraints(pattern=_LABEL_VALUE, max_length=63)]
"""A label value in a node selector (it may be empty)."""

# --- int-or-string ------------------------------------------------------------------------------------------

_QUANTITY_STRING = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[mkMGTPE]|([eE][+-]?[0-9]+))?$"
_PERCENT_STRING = r"^(100|[1-9]?[0-9])%$"


def _int_or_string(
    value: object, *, pattern: str, what: str, error_type: str, max_int: int | None = None
) -> int | str:
    # bool is an int in Python but never a valid quantity; the apiserver rejects it too.
    if isinstance(value, int) and not isinstance(value, bool):
        if value >= 0 and (max_int is None or value <= max_int):
            return value
    elif isinstance(value, str) and len(value) <= 64 and re.fullmatch(pattern, value):
        return value
    raise PydanticCustomError(error_type, "must be {what}", {"what": what})


def _quantity(value: object) -> int | str:
    return _int_or_string(
        value,
        pattern=_QUANTITY_STRING,
        what="a non-negative quantity: an integer or a string such as '500m', '16Gi' or '1.5'",
        error_type="quantity",
    )


def _percent_or_count(value: object) -> int | str:
    return _int_or_string(
        value,
        pattern=_PERCENT_STRING,
        what="a non-negative integer or a percentage between '0%' and '100%'",
        error_type="percent_or_count",
    )


Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": _QUANTITY_STRING,
            "minimum": 0,
            "maxLength": 64,
        }
    ),
]
"""A Kubernetes resource quantity (`4`, `500m`, `16Gi`)."""

PercentOrCount = Annotated[
    int | str,
    PlainValidator(_percent_or_count),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": _PERCENT_STRING,
            "minimum": 0,
            "maxLength": 4,
        }
    ),
]
"""A replica count or a percentage of replicas (`1`, `25%`)."""


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

    type: Annotated[str, StringConstraints(pattern=_QUALIFIED_NAME, max_length=316)]
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


# --- scheduling --------------------------------------------------------------------------------------------

_ShortList = Annotated[list[Annotated[str, StringConstraints(max_length=316)]], Field(max_length=64)]


TOLERATION_RULES: Rules = (
    Rule["Toleration"](
        name="toleration-exists-has-no-value",
        cel="!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
        message="spec.placement.tolerations: a toleration with operator Exists must have no value",
        field_path=".value",
        check=lambda t: t.operator != "Exists" or not t.value,
    ),
    Rule["Toleration"](
        name="toleration-without-key-is-exists",
        cel="(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
        message="spec.placement.tolerations: a toleration without a key must have operator Exists",
        field_path=".operator",
        check=lambda t: bool(t.key) or t.operator == "Exists",
    ),
    Rule["Toleration"](
        name="toleration-seconds-need-noexecute",
        cel="!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
        message="spec.placement.tolerations: tolerationSeconds applies to effect NoExecute only",
        field_path=".tolerationSeconds",
        check=lambda t: t.toleration_seconds is None or t.effect == "NoExecute",
    ),
)


class Toleration(ApiModel):
    """Lets the pods schedule onto nodes with a matching taint (Kubernetes `Toleration`)."""

    validation_rules: ClassVar[Rules] = TOLERATION_RULES

    key: Annotated[str, StringConstraints(max_length=316)] | None = None
    """Taint key to match; empty with operator `Exists` matches every taint."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """`Equal` matches key and value; `Exists` matches any value of the key."""
    value: Annotated[str, StringConstraints(max_length=63)] | None = None
    """Taint value to match with operator `Equal`."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches every effect."""
    toleration_seconds: int | None = None
    """For `NoExecute`: how long the pod stays bound after the taint appears; unset means forever."""


def _values_fit_operator(r: NodeSelectorRequirement) -> bool:
    count = len(r.values or ())
    if r.operator in ("Exists", "DoesNotExist"):
        return count == 0
    return count == 1 if r.operator in ("Gt", "Lt") else count > 0


NODE_SELECTOR_REQUIREMENT_RULES: Rules = (
    Rule["NodeSelectorRequirement"](
        name="node-selector-values-fit-operator",
        cel=(
            "self.operator in ['Exists', 'DoesNotExist'] ? (!has(self.values) || size(self.values) == 0) : "
            "self.operator in ['Gt', 'Lt'] ? (has(self.values) && size(self.values) == 1) : "
            "(has(self.values) && size(self.values) > 0)"
        ),
        message=(
            "spec.placement.affinity: a requirement's values: none for Exists and DoesNotExist, one for Gt "
            "and Lt, one or more for In and NotIn"
        ),
        field_path=".values",
        check=_values_fit_operator,
    ),
)


class NodeSelectorRequirement(ApiModel):
    """A condition on one node label (or field)."""

    validation_rules: ClassVar[Rules] = NODE_SELECTOR_REQUIREMENT_RULES

    key: Annotated[str, StringConstraints(max_length=316)]
    """Label key (or field name for matchFields)."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    """How the label value relates to `values`."""
    values: _ShortList | None = None
    """Values for `In`/`NotIn` (one or more) and `Gt`/`Lt` (one integer); empty for `Exists`/`DoesNotExist`.
    """


class NodeSelectorTerm(ApiModel):
    """Requirements that must all hold (AND) for a node to match."""

    match_expressions: Annotated[list[NodeSelectorRequirement], Field(max_length=32)] | None = None
    """Requirements on node labels."""
    match_fields: Annotated[list[NodeSelectorRequirement], Field(max_length=32)] | None = None
    """Requirements on node fields (only `metadata.name` is supported by Kubernetes)."""


class NodeSelector(ApiModel):
    """Terms of which at least one must match (OR)."""

    node_selector_terms: Annotated[list[NodeSelectorTerm], Field(min_length=1, max_length=32)]
    """The terms; a node matches when any term matches."""


class PreferredSchedulingTerm(ApiModel):
    """A weighted node preference."""

    weight: Annotated[int, Field(ge=1, le=100)]
    """Weight added to a node's score when `preference` matches (1-100)."""
    preference: NodeSelectorTerm
    """The node selector term to prefer."""


class NodeAffinity(ApiModel):
    """Node affinity rules (Kubernetes `NodeAffinity`)."""

    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    """Nodes the pods may run on; pods stay pending when no node matches."""
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[PreferredSchedulingTerm], Field(max_length=32)] | None
    ) = None
    """Nodes the scheduler prefers, by weight."""


class LabelSelectorRequirement(ApiModel):
    """A condition on one label."""

    key: Annotated[str, StringConstraints(max_length=316)]
    """Label key."""
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    """How the label value relates to `values`."""
    values: _ShortList | None = None
    """Values for `In`/`NotIn`; empty for `Exists`/`DoesNotExist`."""


class LabelSelector(ApiModel):
    """A label query over pods (Kubernetes `LabelSelector`); all parts must match."""

    match_labels: Annotated[dict[str, str], Field(max_length=64)] | None = None
    """Exact label key/value pairs."""
    match_expressions: Annotated[list[LabelSelectorRequirement], Field(max_length=32)] | None = None
    """Set-based requirements."""


class PodAffinityTerm(ApiModel):
    """Pods (selected by labels and namespaces) that the pods should run near or away from."""

    label_selector: LabelSelector | None = None
    """Which pods this term refers to."""
    namespace_selector: LabelSelector | None = None
    """Namespaces to look in, by label; with `namespaces` unset and this unset, the pod's own namespace."""
    namespaces: _ShortList | None = None
    """Namespaces to look in, by name."""
    topology_key: Annotated[str, StringConstraints(min_length=1, max_length=316)]
    """Node label that defines co-location, e.g. `kubernetes.io/hostname`."""
    match_label_keys: _ShortList | None = None
    """Pod label keys whose values are copied from the incoming pod into the selector."""
    mismatch_label_keys: _ShortList | None = None
    """Pod label keys whose values must differ from the incoming pod's."""


class WeightedPodAffinityTerm(ApiModel):
    """A weighted pod (anti-)affinity preference."""

    weight: Annotated[int, Field(ge=1, le=100)]
    """Weight added to a node's score when the term matches (1-100)."""
    pod_affinity_term: PodAffinityTerm
    """The pod affinity term."""


class PodAffinity(ApiModel):
    """Run the pods near other pods (Kubernetes `PodAffinity`)."""

    required_during_scheduling_ignored_during_execution: (
        Annotated[list[PodAffinityTerm], Field(max_length=32)] | None
    ) = None
    """Terms that must hold for a node to be chosen."""
    preferred_during_scheduling_ignored_during_execution: (
        Annotated[list[WeightedPodAffinityTerm], Field(max_length=32)] | None
    ) = None
    """Terms the scheduler prefers, by weight."""


class PodAntiAffinity(PodAffinity):
    """Keep the pods away from other pods (Kubernetes `PodAntiAffinity`)."""


class Affinity(ApiModel):
    """Scheduling constraints (Kubernetes `Affinity`), added to those the operator derives from the spec."""

    node_affinity: NodeAffinity | None = None
    """Constraints on the nodes the pods run on."""
    pod_affinity: PodAffinity | None = None
    """Constraints to run near other pods."""
    pod_anti_affinity: PodAntiAffinity | None = None
    """Constraints to run away from other pods."""
