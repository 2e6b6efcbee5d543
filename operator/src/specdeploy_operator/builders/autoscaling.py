"""The autoscaler of a SpeculativeDeployment (`spec.autoscaling`): a HorizontalPodAutoscaler
(autoscaling/v2) or a KEDA ScaledObject. Both scale the SpeculativeDeployment itself through its scale
subresource (`spec.replicas`, `status.replicas`, `status.selector`), never the Deployment underneath, so the
operator stays the only writer of the Deployment. Pure functions."""

from __future__ import annotations

from typing import Any, Final

from specdeploy_operator.api import (
    AutoscalingSpec,
    KedaSpec,
    ScaleDownSpec,
    ScaleUpSpec,
    SpeculativeDeployment,
)

from .common import child_metadata, deployment_name
from .leaderworkerset import group_set_name
from .settings import OperatorSettings

__all__ = [
    "AUTOSCALER_COMPONENT",
    "HPA_API_VERSION",
    "KEDA_API_VERSION",
    "METRIC_NAMES",
    "autoscaler_kind",
    "autoscaler_report",
    "build_autoscaler",
    "build_hpa",
    "build_scaled_object",
    "keda_query",
    "quantity",
]

HPA_API_VERSION: Final = "autoscaling/v2"
KEDA_API_VERSION: Final = "keda.sh/v1alpha1"
AUTOSCALER_COMPONENT: Final = "autoscaler"
METRIC_NAMES: Final[dict[str, str]] = {
    "queueSeconds": "specdeploy_queue_seconds",
    "queueDepth": "specdeploy_queue_depth",
}
"""`spec.autoscaling.metric` -> the gauge the server exports on `/metrics`, which is also the metric's name in
the custom metrics API (prometheus-adapter keeps series names) and in the KEDA query."""


def quantity(value: float) -> str:
    """A Kubernetes quantity for a positive `value`: whole numbers plain, others in milli-units
    (`2.5` -> `2500m`); never `0m`, which would be no target at all."""
    if value == int(value):
        return str(int(value))
    return f"{max(1, round(value * 1000))}m"


def autoscaler_kind(spec: AutoscalingSpec) -> str:
    """Kind of the object `spec` renders."""
    return "ScaledObject" if spec.engine == "keda" else "HorizontalPodAutoscaler"


def _scale_target(sdep: SpeculativeDeployment) -> dict[str, str]:
    return {"apiVersion": sdep.api_version, "kind": sdep.kind, "name": deployment_name(sdep)}


def _rules(rules: ScaleUpSpec | ScaleDownSpec) -> dict[str, Any]:
    policies: list[dict[str, Any]] = [
        {"type": "Pods", "value": rules.max_pods, "periodSeconds": rules.period_seconds}
    ]
    if rules.max_percent is not None:
        policies.append(
            {"type": "Percent", "value": rules.max_percent, "periodSeconds": rules.period_seconds}
        )
    return {
        "stabilizationWindowSeconds": rules.stabilization_window_seconds,
        "selectPolicy": "Max",
        "policies": policies,
    }


def _behavior(spec: AutoscalingSpec) -> dict[str, Any]:
    return {"scaleUp": _rules(spec.scale_up), "scaleDown": _rules(spec.scale_down)}


def _spec_of(sdep: SpeculativeDeployment) -> AutoscalingSpec:
    if sdep.spec.autoscaling is None:
        raise ValueError("spec.autoscaling is not set")
    return sdep.spec.autoscaling


def build_hpa(sdep: SpeculativeDeployment) -> dict[str, Any]:
    """The HorizontalPodAutoscaler of `spec.autoscaling` (`engine: hpa`): one `Pods` metric with an
    `AverageValue` target, read from the custom metrics API."""
    auto = _spec_of(sdep)
    return {
        "apiVersion": HPA_API_VERSION,
        "kind": "HorizontalPodAutoscaler",
        "metadata": child_metadata(sdep, AUTOSCALER_COMPONENT),
        "spec": {
            "scaleTargetRef": _scale_target(sdep),
            "minReplicas": auto.min_replicas,
            "maxReplicas": auto.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": METRIC_NAMES[auto.metric]},
                        "target": {"type": "AverageValue", "averageValue": quantity(auto.target_value)},
                    },
                }
            ],
            "behavior": _behavior(auto),
        },
    }


#: the API server cuts a generated name's base (`<replicaset>-` for a pod) to this many characters, then adds
#: 5 random ones (apiserver's names.SimpleNameGenerator)
GENERATED_BASE: Final = 58
#: a pod-template-hash has at most 10 characters
TEMPLATE_HASH: Final = 10


def serving_pod_pattern(name: str) -> str:
    """A regex (anchored, as PromQL's are) of the names of the Deployment `name`'s pods: `<name>-<pod-template
    hash>-<5 random>`, from a base cut to GENERATED_BASE characters when the name is long; the pods of a
    deployment whose name merely starts with this one's do not match while the base is whole."""
    if len(name) + 1 + TEMPLATE_HASH + 1 <= GENERATED_BASE:
        return f"{name}-[a-z0-9]+-[a-z0-9]+"
    if len(name) >= GENERATED_BASE:
        return f"{name[:GENERATED_BASE]}[a-z0-9]{{5}}"
    return f"{name}-[a-z0-9]*-?[a-z0-9]{{5}}"


def keda_query(sdep: SpeculativeDeployment) -> str:
    """PromQL summing the deployment's metric over its serving pods (`spec.autoscaling.keda.query` wins)."""
    auto = _spec_of(sdep)
    if auto.keda is not None and auto.keda.query:
        return auto.keda.query
    namespace = sdep.metadata.namespace or "default"
    pods = serving_pod_pattern(deployment_name(sdep))
    if sdep.spec.nodes_per_replica > 1:  # the leaders of the groups, `<set>-<group index>`, serve
        pods = f"{group_set_name(sdep)}-[0-9]+"
    return f'sum({METRIC_NAMES[auto.metric]}{{namespace="{namespace}",pod=~"{pods}"}})'


def build_scaled_object(
    sdep: SpeculativeDeployment, settings: OperatorSettings | None = None
) -> dict[str, Any]:
    """The KEDA ScaledObject of `spec.autoscaling` (`engine: keda`): a Prometheus trigger whose query sums
    the metric over the serving pods, with an `AverageValue` threshold (KEDA's HPA divides by the replica
    count), and the same scale-up/scale-down behaviour as the HPA would have."""
    settings = settings or OperatorSettings()
    auto = _spec_of(sdep)
    keda = auto.keda or KedaSpec()
    server = keda.server_address or settings.prometheus_url
    trigger_meta = {
        "serverAddress": server,
        "query": keda_query(sdep),
        "threshold": quantity(auto.target_value),
    }
    if auto.min_replicas == 0:
        # Scale from zero as soon as any work is queued.
        trigger_meta["activationThreshold"] = "0"
    return {
        "apiVersion": KEDA_API_VERSION,
        "kind": "ScaledObject",
        "metadata": child_metadata(sdep, AUTOSCALER_COMPONENT),
        "spec": {
            "scaleTargetRef": _scale_target(sdep),
            "minReplicaCount": auto.min_replicas,
            "maxReplicaCount": auto.max_replicas,
            "pollingInterval": keda.polling_interval_seconds,
            "cooldownPeriod": keda.cooldown_period_seconds,
            "advanced": {"horizontalPodAutoscalerConfig": {"behavior": _behavior(auto)}},
            "triggers": [
                {
                    "type": "prometheus",
                    "name": METRIC_NAMES[auto.metric],
                    "metricType": "AverageValue",
                    "metadata": trigger_meta,
                }
            ],
        },
    }


def build_autoscaler(
    sdep: SpeculativeDeployment, settings: OperatorSettings | None = None
) -> dict[str, Any] | None:
    """The autoscaler `spec.autoscaling` asks for, or None when it is unset."""
    auto = sdep.spec.autoscaling
    if auto is None:
        return None
    if auto.engine == "keda":
        return build_scaled_object(sdep, settings)
    return build_hpa(sdep)


def autoscaler_report(sdep: SpeculativeDeployment) -> dict[str, Any] | None:
    """What `status.autoscaler` says of the autoscaler `spec.autoscaling` asks for (kind, name, metric,
    target), before anything it reports itself; None without one."""
    auto = sdep.spec.autoscaling
    if auto is None:
        return None
    return {
        "kind": autoscaler_kind(auto),
        "name": deployment_name(sdep),
        "metric": METRIC_NAMES[auto.metric],
        "target": quantity(auto.target_value),
    }
