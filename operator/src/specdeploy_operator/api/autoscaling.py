"""Horizontal autoscaling of a SpeculativeDeployment (`spec.autoscaling`): the HorizontalPodAutoscaler or KEDA
ScaledObject the operator creates and owns."""

from __future__ import annotations

from typing import Annotated, ClassVar, Final, Literal

from pydantic import Field, StringConstraints

from .base import ApiModel, Rule, Rules

__all__ = [
    "AUTOSCALING_RULES",
    "DEFAULT_TARGETS",
    "AutoscalingEngine",
    "AutoscalingMetric",
    "AutoscalingSpec",
    "KedaSpec",
    "ScaleDownSpec",
    "ScaleUpSpec",
]

AutoscalingMetric = Literal["queueSeconds", "queueDepth"]
AutoscalingEngine = Literal["hpa", "keda"]

DEFAULT_TARGETS: Final[dict[str, float]] = {"queueSeconds": 10.0, "queueDepth": 8.0}
"""`spec.autoscaling.target` when unset, per metric."""


def _min_within_max(s: AutoscalingSpec) -> bool:
    return s.min_replicas <= s.max_replicas


def _zero_needs_keda(s: AutoscalingSpec) -> bool:
    return s.min_replicas > 0 or s.engine == "keda"


def _keda_settings_need_keda(s: AutoscalingSpec) -> bool:
    return s.keda is None or s.engine == "keda"


AUTOSCALING_RULES: Rules = (
    Rule["AutoscalingSpec"](
        name="autoscaling-min-within-max",
        cel="self.minReplicas <= self.maxReplicas",
        message="spec.autoscaling.minReplicas must not exceed spec.autoscaling.maxReplicas",
        field_path=".minReplicas",
        check=_min_within_max,
    ),
    Rule["AutoscalingSpec"](
        name="autoscaling-zero-needs-keda",
        cel="self.minReplicas > 0 || self.engine == 'keda'",
        message="spec.autoscaling.minReplicas 0 needs spec.autoscaling.engine keda "
        "(a HorizontalPodAutoscaler cannot scale to zero)",
        field_path=".minReplicas",
        check=_zero_needs_keda,
    ),
    Rule["AutoscalingSpec"](
        name="autoscaling-keda-settings-need-keda",
        cel="!has(self.keda) || self.engine == 'keda'",
        message="spec.autoscaling.keda is only used with spec.autoscaling.engine keda",
        field_path=".keda",
        check=_keda_settings_need_keda,
    ),
)


class ScaleUpSpec(ApiModel):
    """How fast replicas are added. Defaults suit GPUs: react at once (a queue that builds up only gets
    longer while a new pod loads its engines), up to 4 pods or doubling per minute, whichever is more."""

    stabilization_window_seconds: Annotated[int, Field(ge=0, le=3600)] = 0
    """The highest recommendation of this window is used before scaling up; 0 scales up at once."""
    max_pods: Annotated[int, Field(ge=1, le=1024)] = 4
    """At most this many pods added per `periodSeconds`."""
    max_percent: Annotated[int, Field(ge=1, le=1000)] | None = 100
    """At most this percentage of the current replicas added per `periodSeconds`; the larger of the two
    limits applies. Unset: only `maxPods`."""
    period_seconds: Annotated[int, Field(ge=1, le=1800)] = 60
    """Length of the period the limits apply to."""


class ScaleDownSpec(ApiModel):
    """How fast replicas are removed. Defaults suit GPUs: a replica is expensive to bring back (node, engine
    load), so scale down only after a 10-minute window of lower load, one pod every 2 minutes."""

    stabilization_window_seconds: Annotated[int, Field(ge=0, le=3600)] = 600
    """The highest recommendation of this window is used before scaling down, so a dip does not remove
    pods."""
    max_pods: Annotated[int, Field(ge=1, le=1024)] = 1
    """At most this many pods removed per `periodSeconds`."""
    max_percent: Annotated[int, Field(ge=1, le=100)] | None = None
    """At most this percentage of the current replicas removed per `periodSeconds`; the larger of the two
    limits applies. Unset: only `maxPods`."""
    period_seconds: Annotated[int, Field(ge=1, le=1800)] = 120
    """Length of the period the limits apply to."""


class KedaSpec(ApiModel):
    """The KEDA `ScaledObject` (with `engine: keda`): a Prometheus trigger on the server's metric."""

    server_address: Annotated[str, StringConstraints(pattern=r"^https?://\S+$", max_length=512)] | None = None
    """Prometheus base URL; unset uses the operator's `SPECDEPLOY_PROMETHEUS_URL`."""
    query: Annotated[str, StringConstraints(min_length=1, max_length=4096)] | None = None
    """PromQL returning the deployment's total of `metric` (summed over its pods; the HPA KEDA creates
    divides it by the replica count). Unset: `sum(specdeploy_queue_seconds{namespace="<ns>",
    pod=~"<name>-[a-z0-9]+-[a-z0-9]+"})` (or `specdeploy_queue_depth`; for names over 46 characters the
    pattern follows the API server's cut of generated pod names)."""
    polling_interval_seconds: Annotated[int, Field(ge=1, le=3600)] = 15
    """How often KEDA queries Prometheus."""
    cooldown_period_seconds: Annotated[int, Field(ge=0, le=86400)] = 300
    """With `minReplicas: 0`: how long after the last activity KEDA scales to zero."""


class AutoscalingSpec(ApiModel):
    """Horizontal autoscaling on the server's load signals. When set, the operator creates and owns a
    HorizontalPodAutoscaler (or a KEDA ScaledObject) that scales this SpeculativeDeployment through its scale
    subresource, and `spec.replicas` is what the autoscaler last chose; a manual `kubectl scale` is
    overridden at its next sync. Removing `autoscaling` removes the autoscaler and `spec.replicas` rules."""

    validation_rules: ClassVar[Rules] = AUTOSCALING_RULES

    engine: AutoscalingEngine = "hpa"
    """`hpa`: a HorizontalPodAutoscaler reading the metric from the custom metrics API
    (`custom.metrics.k8s.io`, e.g. prometheus-adapter). `keda`: a KEDA ScaledObject with a Prometheus
    trigger (KEDA must be installed)."""
    min_replicas: Annotated[int, Field(ge=0, le=1024)] = 1
    """Fewest replicas; 0 only with `engine: keda`."""
    max_replicas: Annotated[int, Field(ge=1, le=1024)]
    """Most replicas; at least `minReplicas`."""
    metric: AutoscalingMetric = "queueSeconds"
    """Per-replica signal (a `Pods` metric, averaged over the replicas): `queueSeconds`
    (`specdeploy_queue_seconds`: seconds of generation queued on the replica, i.e. tokens still to generate
    for its waiting and running requests divided by its measured generation rate, which includes the
    speculative speedup) or `queueDepth` (`specdeploy_queue_depth`: requests waiting plus running)."""
    target: Annotated[float, Field(gt=0, le=1000000)] | None = None
    """Average value of `metric` per replica to aim for; unset: 10 for `queueSeconds`, 8 for `queueDepth`."""
    scale_up: ScaleUpSpec = Field(default_factory=ScaleUpSpec, json_schema_extra={"default": {}})
    """Scale-up behaviour."""
    scale_down: ScaleDownSpec = Field(default_factory=ScaleDownSpec, json_schema_extra={"default": {}})
    """Scale-down behaviour."""
    keda: KedaSpec | None = None
    """KEDA settings; only with `engine: keda`."""

    @property
    def target_value(self) -> float:
        """`target`, or the metric's default."""
        return self.target if self.target is not None else DEFAULT_TARGETS[self.metric]
