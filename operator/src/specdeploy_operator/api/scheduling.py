"""Kubernetes scheduling types used inside `spec.placement`: tolerations and affinity.

These are typed (not `x-kubernetes-preserve-unknown-fields`) so that the apiserver rejects typos inside
`spec.placement.affinity` as it does everywhere else, and so `kubectl explain` can describe every field.
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from .base import ApiModel, Rule, Rules

__all__ = [
    "NODE_SELECTOR_REQUIREMENT_RULES",
    "TOLERATION_RULES",
    "Affinity",
    "LabelSelector",
    "LabelSelectorRequirement",
    "NodeAffinity",
    "NodeSelector",
    "NodeSelectorRequirement",
    "NodeSelectorTerm",
    "PodAffinity",
    "PodAffinityTerm",
    "PodAntiAffinity",
    "PreferredSchedulingTerm",
    "Toleration",
    "WeightedPodAffinityTerm",
]

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
