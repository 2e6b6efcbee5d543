"""Serving children of a SpeculativeDeployment: the Deployment of the serving pods (their facts are
`pod.py`'s, their configuration `serverconfig.py`'s), the Service and the PodDisruptionBudget.
`serving_children` renders all four at once, the serving pod and its configuration once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from specdeploy_operator.api import EngineBuild, SpeculativeDeployment

from .claims import build_cache_pvc, build_default_cache_pvc
from .common import (
    SERVER_COMPONENT,
    child_metadata,
    configmap_name,
    deployment_name,
    endpoint,
    group_pod_selector,
    labels,
    pod_selector,
    status_selector,
)
from .engines import engine_builds_of
from .grouplaunch import launch_scripts
from .leaderworkerset import leader_worker_set_for
from .pod import CONFIG_FILE, CONFIG_MOUNT, ServingPod, serving_pod
from .podtemplate import pod_spec_for, server_command, server_container, template_annotations
from .serverconfig import build_configmap, configmap_for, server_config
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


def deployment_for(
    sdep: SpeculativeDeployment, pod: ServingPod, configmap: Mapping[str, Any], settings: OperatorSettings
) -> dict[str, Any]:
    """The Deployment of the serving pods `pod`, configured by `configmap` (a replica on one node)."""
    spec = sdep.spec
    name = deployment_name(sdep)
    container = server_container(sdep, pod, settings)
    template_meta: dict[str, Any] = {
        "labels": labels(name, SERVER_COMPONENT),
        "annotations": template_annotations(pod, configmap),
    }
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
            "template": {"metadata": template_meta, "spec": pod_spec_for(sdep, pod, [container])},
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
    """PodDisruptionBudget: voluntary evictions (node drains, a cluster autoscaler emptying a node) take at
    most one replica at a time. A single replica is not protected: `minAvailable: 1` would block every drain
    of its node forever. On one node a replica is a pod: at least `replicas - 1` serving pods stay (following
    `spec.replicas`, so it stays right while an autoscaler changes the count). A replica that spans nodes is a
    group that one eviction restarts whole: the budget covers every pod of every group with `maxUnavailable:
    1`, so one eviction at a time, and the next only once the restarted group is ready again."""
    spec = sdep.spec
    if spec.nodes_per_replica == 1:
        budget: dict[str, Any] = {"minAvailable": max(spec.replicas - 1, 0)}
        selector = pod_selector(sdep)
    else:
        budget = {"maxUnavailable": 1} if spec.replicas > 1 else {"minAvailable": 0}
        selector = group_pod_selector(sdep)
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": child_metadata(sdep, SERVER_COMPONENT),
        "spec": {**budget, "selector": {"matchLabels": selector}},
    }


@dataclass(frozen=True, slots=True)
class ServingChildren:
    """The serving objects of one deployment, in apply order: ConfigMap, Service, PDB, then the workload:
    the Deployment of its pods, or the LeaderWorkerSet of its groups when a replica spans nodes."""

    configmap: dict[str, Any]
    service: dict[str, Any]
    pdb: dict[str, Any]
    workload: dict[str, Any]


def serving_children(
    sdep: SpeculativeDeployment, engines: Sequence[EngineBuild], settings: OperatorSettings
) -> ServingChildren:
    """Every serving object of `sdep` with its built `engines`."""
    pod = serving_pod(sdep, engines, settings)
    scripts = launch_scripts(sdep, server_command(pod))
    configmap = configmap_for(sdep, server_config(sdep, pod, settings), scripts)
    workload = (
        deployment_for(sdep, pod, configmap, settings)
        if sdep.spec.nodes_per_replica == 1
        else leader_worker_set_for(sdep, pod, configmap, settings)
    )
    return ServingChildren(
        configmap=configmap,
        service=build_service(sdep),
        pdb=build_pdb(sdep),
        workload=workload,
    )
