"""The pod template parts every serving workload shares (a Deployment's pods, a LeaderWorkerSet group's
leader and workers): the server container, the pod spec around containers, and the annotations that roll
the pods when their configuration or engines change. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from specdeploy_operator.api import SpeculativeDeployment

from .common import ENGINE_HASHES_ANNOTATION
from .pod import PRESTOP_SECONDS, ServingPod
from .podsecurity import harden_pod_spec
from .serverconfig import config_digest
from .settings import OperatorSettings

__all__ = [
    "CONFIG_HASH_ANNOTATION",
    "pod_spec_for",
    "probe",
    "server_command",
    "server_container",
    "serving_env",
    "template_annotations",
]

CONFIG_HASH_ANNOTATION: Final = "specdeploy.dev/config-hash"


def probe(path: str, port: int, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": port},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def server_command(pod: ServingPod) -> list[str]:
    """The server's command line."""
    return ["specdeploy-server", "--config", pod.config_file]


def serving_env(sdep: SpeculativeDeployment) -> list[dict[str, str]]:
    """`spec.serving.env` as container environment."""
    return [{"name": e.name, "value": e.value} for e in sdep.spec.serving.env or ()]


def server_container(
    sdep: SpeculativeDeployment, pod: ServingPod, settings: OperatorSettings
) -> dict[str, Any]:
    """The container that runs the server (HTTP on `spec.serving.port`, probed on it)."""
    port = sdep.spec.serving.port
    env = serving_env(sdep)
    return {
        "name": "server",
        "image": pod.image,
        "command": server_command(pod),
        **({"env": env} if env else {}),
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "resources": pod.resources,
        "volumeMounts": pod.mounts,
        # Every 2 s while the server starts: a replica serves within 2 s of being able to (with 10 s, up to
        # 10 s late: the scale-up benchmark saw it). Cheap: one GET per 2 s, only until the first success.
        "startupProbe": probe("/health/ready", port, 2, max(settings.startup_timeout_seconds // 2, 1)),
        "readinessProbe": probe("/health/ready", port, 5, 3),
        "livenessProbe": probe("/health/live", port, 10, 6),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRESTOP_SECONDS}}},
    }


def pod_spec_for(
    sdep: SpeculativeDeployment, pod: ServingPod, containers: list[dict[str, Any]]
) -> dict[str, Any]:
    """The serving pod's spec around `containers`: scheduling, init containers, volumes, security."""
    spec = sdep.spec
    pod_spec: dict[str, Any] = {"terminationGracePeriodSeconds": pod.grace_period_seconds}
    if pod.node_selector:
        pod_spec["nodeSelector"] = pod.node_selector
    if pod.tolerations:
        pod_spec["tolerations"] = pod.tolerations
    if spec.placement.affinity is not None:
        pod_spec["affinity"] = spec.placement.affinity.to_dict()
    if spec.placement.priority_class_name:
        pod_spec["priorityClassName"] = spec.placement.priority_class_name
    pod_spec.update(pod.identity.pod_fields())
    if pod.init_containers:
        pod_spec["initContainers"] = pod.init_containers
    pod_spec["containers"] = containers
    pod_spec["volumes"] = pod.volumes
    return harden_pod_spec(pod_spec, spec.pod_security, mount_token=pod.identity.mount_token)


def template_annotations(pod: ServingPod, configmap: Mapping[str, Any]) -> dict[str, str]:
    """A changed configuration (runtime, serving, launch) or a new engine changes the pod template: pods
    roll."""
    annotations = {CONFIG_HASH_ANNOTATION: config_digest(configmap)}
    if pod.engine_hashes:
        annotations[ENGINE_HASHES_ANNOTATION] = pod.engine_hashes
    return annotations
