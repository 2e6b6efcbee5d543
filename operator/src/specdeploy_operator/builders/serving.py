"""Serving children of a SpeculativeDeployment: the Deployment of the serving pods (their facts are
`pod.py`'s, their configuration `serverconfig.py`'s), the Service and the PodDisruptionBudget.
`serving_children` renders all four at once, the serving pod and its configuration once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from specdeploy_operator.api import EngineBuild, SpeculativeDeployment

from .claims import build_cache_pvc, build_default_cache_pvc
from .common import (
    ENGINE_HASHES_ANNOTATION,
    SERVER_COMPONENT,
    child_metadata,
    configmap_name,
    deployment_name,
    endpoint,
    labels,
    pod_selector,
    status_selector,
)
from .engines import engine_builds_of
from .pod import CONFIG_FILE, CONFIG_MOUNT, PRESTOP_SECONDS, ServingPod, serving_pod
from .podsecurity import harden_pod_spec
from .serverconfig import build_configmap, config_digest, configmap_for, server_config
from .settings import OperatorSettings

__all__ = [
    "CONFIG_FILE",
    "CONFIG_MOUNT",
    "ServingChildren",
    "build_cache_pvc",
    "build_configmap",
    "build_default_cache_pvc",
    "build_deployment",
    "build_pdb",
    "build_service",
    "configmap_name",
    "deployment_for",
    "endpoint",
    "pod_selector",
    "serving_children",
    "status_selector",
]

CONFIG_HASH_ANNOTATION: Final = "specdeploy.dev/config-hash"


def _probe(path: str, port: int, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def deployment_for(
    sdep: SpeculativeDeployment, pod: ServingPod, configmap: Mapping[str, Any], settings: OperatorSettings
) -> dict[str, Any]:
    """The Deployment of the serving pods `pod`, configured by `configmap`."""
    spec = sdep.spec
    name = deployment_name(sdep)
    port = spec.serving.port
    container: dict[str, Any] = {
        "name": "server",
        "image": pod.image,
        "command": ["specdeploy-server", "--config", pod.config_file],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": pod.resources,
        "volumeMounts": pod.mounts,
        # Every 2 s while the server starts: a replica serves within 2 s of being able to (with 10 s, up to
        # 10 s late: the scale-up benchmark saw it). Cheap: one GET per 2 s, only until the first success.
        "startupProbe": _probe("/health/ready", port, 2, max(settings.startup_timeout_seconds // 2, 1)),
        "readinessProbe": _probe("/health/ready", port, 5, 3),
        "livenessProbe": _probe("/health/live", port, 10, 6),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
    }
    pod_spec: dict[str, Any] = {"terminationGracePeriodSeconds": pod.grace_period_seconds}
    if pod.node_selector:
        pod_spec["nodeSelector"] = pod.node_selector
    if pod.tolerations:
        pod_spec["tolerations"] = pod.tolerations
    if spec.placement.affinity is not None:
        pod_spec["affinity"] = spec.placement.affinity.to_dict()
    if spec.placement.priority_class_name:
        pod_spec["priorityClassName"] = spec.placement.priority_class_name
    if pod.init_containers:
        pod_spec["initContainers"] = pod.init_containers
    pod_spec["containers"] = [container]
    pod_spec["volumes"] = pod.volumes
    pod_spec = harden_pod_spec(pod_spec, spec.pod_security)
    # A changed configuration (runtime, serving) or a new engine changes the pod template: pods roll.
    annotations = {CONFIG_HASH_ANNOTATION: config_digest(configmap)}
    if pod.engine_hashes:
        annotations[ENGINE_HASHES_ANNOTATION] = pod.engine_hashes
    template_meta: dict[str, Any] = {"labels": labels(name, SERVER_COMPONENT), "annotations": annotations}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": child_metadata(sdep, SERVER_COMPONENT),
        "spec": {
            "replicas": spec.replicas,
            "progressDeadlineSeconds": settings.startup_timeout_seconds + 300,
            "revisionHistoryLimit": 3,
            "selector": {"matchLabels": pod_selector(sdep)},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {
                    "maxSurge": spec.rollout.max_surge,
                    "maxUnavailable": spec.rollout.max_unavailable,
                },
            },
            "template": {"metadata": template_meta, "spec": pod_spec},
        },
    }


def build_deployment(
    sdep: SpeculativeDeployment,
    engines: Sequence[EngineBuild | Mapping[str, Any]],
    settings: OperatorSettings | None = None,
    *,
    configmap: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The Deployment of the serving pods. With backend `tensorrt`, `engines` must hold the EngineBuild of
    every model (`ValueError` otherwise). `configmap`: the deployment's `build_configmap`, when the caller
    rendered it already."""
    settings = settings or OperatorSettings()
    pod = serving_pod(sdep, engine_builds_of(engines), settings)
    if configmap is None:
        configmap = configmap_for(sdep, server_config(sdep, pod, settings))
    return deployment_for(sdep, pod, configmap, settings)


def build_service(sdep: SpeculativeDeployment) -> dict[str, Any]:
    """ClusterIP Service named like the deployment (the endpoint's host)."""
    port = sdep.spec.serving.port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": child_metadata(sdep, SERVER_COMPONENT),
        "spec": {
            "type": "ClusterIP",
            "selector": pod_selector(sdep),
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def build_pdb(sdep: SpeculativeDeployment) -> dict[str, Any]:
    """PodDisruptionBudget: voluntary evictions (node drains, a cluster autoscaler emptying a node) leave at
    least `replicas - 1` serving pods, so they take at most one at a time. A single replica is not protected:
    `minAvailable: 1` would block every drain of its node forever. It follows `spec.replicas`, so it stays
    right while an autoscaler changes the count."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(sdep, SERVER_COMPONENT),
        "spec": {
            "minAvailable": max(sdep.spec.replicas - 1, 0),
            "selector": {"matchLabels": pod_selector(sdep)},
        },
    }


@dataclass(frozen=True, slots=True)
class ServingChildren:
    """The serving objects of one deployment, in apply order: ConfigMap, Service, PDB, then the Deployment."""

    configmap: dict[str, Any]
    service: dict[str, Any]
    pdb: dict[str, Any]
    deployment: dict[str, Any]


def serving_children(
    sdep: SpeculativeDeployment, engines: Sequence[EngineBuild], settings: OperatorSettings
) -> ServingChildren:
    """Every serving object of `sdep` with its built `engines`."""
    pod = serving_pod(sdep, engines, settings)
    configmap = configmap_for(sdep, server_config(sdep, pod, settings))
    return ServingChildren(
        configmap=configmap,
        service=build_service(sdep),
        pdb=build_pdb(sdep),
        deployment=deployment_for(sdep, pod, configmap, settings),
    )
