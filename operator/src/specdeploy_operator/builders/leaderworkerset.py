"""The LeaderWorkerSet of a deployment whose replicas span nodes (`leaderworkerset.x-k8s.io/v1`,
kubernetes-sigs/lws): one group per replica, one pod per node, the leader first. Pure.

- `replicas` is the number of groups: the SpeculativeDeployment's `spec.replicas`, which its scale
  subresource (HPA, KEDA) sets as for a Deployment.
- The leader runs rank 0, the server: the Service selects it (component `server`) and its probes are the
  server's. The workers (component `worker`) hold the other ranks and are ready once their `sshd` listens.
  How the ranks start is `grouplaunch.py`'s.
- `RecreateGroupOnPodRestart`: one pod failing restarts the whole group (MPI ranks cannot rejoin a job).
- Rolling updates replace whole groups, at most `spec.rollout.maxUnavailable` at a time, with
  `spec.rollout.maxSurge` extra groups.
- `spec.placement.multiNode.exclusiveTopology`: LeaderWorkerSet's exclusive placement, a group's pods on
  one value of that node label and one group per value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from specdeploy_operator.api import SpeculativeDeployment

from .common import (
    MAX_NAME,
    SERVER_COMPONENT,
    child_metadata,
    deployment_name,
    dns_label,
    labels,
    short_hash,
)
from .grouplaunch import KEY_PORT, LEADER_SCRIPT, SSH_PORT, WORKER_SCRIPT, rank_env
from .pod import CONFIG_MOUNT, ServingPod
from .podtemplate import pod_spec_for, server_container, template_annotations
from .settings import OperatorSettings

__all__ = [
    "EXCLUSIVE_TOPOLOGY_ANNOTATION",
    "GROUP_INDEX_LABEL",
    "LWS_API_VERSION",
    "NAME_LABEL",
    "WORKER_COMPONENT",
    "WORKER_INDEX_LABEL",
    "group_set_name",
    "leader_worker_set_for",
]

LWS_API_VERSION: Final = "leaderworkerset.x-k8s.io/v1"
EXCLUSIVE_TOPOLOGY_ANNOTATION: Final = "leaderworkerset.sigs.k8s.io/exclusive-topology"
# The labels the LeaderWorkerSet controller and its pod webhook put on a group's pods.
NAME_LABEL: Final = "leaderworkerset.sigs.k8s.io/name"
GROUP_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/group-index"
WORKER_INDEX_LABEL: Final = "leaderworkerset.sigs.k8s.io/worker-index"
"""0 on the leader, 1.. on the workers."""
WORKER_COMPONENT: Final = "worker"
"""`app.kubernetes.io/component` of a group's worker pods (the leader's is `server`)."""
_MAX_GROUP_SET_NAME: Final = MAX_NAME - len("-1023") - len("-") - 10
"""A group's StatefulSet is `<set>-<group index>` and its pods carry `controller-revision-hash:
<statefulset>-<10 characters>`, a label value of at most 63 characters."""


def group_set_name(sdep: SpeculativeDeployment) -> str:
    """The LeaderWorkerSet's name: `<deployment>-lws`, with a hash of the whole name when that is too long.
    Not the deployment's own name: the LeaderWorkerSet controller creates a headless Service of its name, and
    the deployment's Service has that one."""
    name = deployment_name(sdep)
    whole = f"{name}-lws"
    if len(whole) <= _MAX_GROUP_SET_NAME:
        return whole
    return dns_label(name, f"{short_hash(name)}-lws", max_length=_MAX_GROUP_SET_NAME)


def _leader(sdep: SpeculativeDeployment, pod: ServingPod, settings: OperatorSettings) -> dict[str, Any]:
    container = server_container(sdep, pod, settings)
    container["command"] = ["sh", f"{CONFIG_MOUNT}/{LEADER_SCRIPT}"]
    container["env"] = rank_env(sdep)
    container["ports"] = [
        *container["ports"],
        {"name": "rank-key", "containerPort": KEY_PORT, "protocol": "TCP"},
    ]
    return container


def _worker(sdep: SpeculativeDeployment, pod: ServingPod) -> dict[str, Any]:
    return {
        "name": "worker",
        "image": pod.image,
        "command": ["sh", f"{CONFIG_MOUNT}/{WORKER_SCRIPT}"],
        "env": rank_env(sdep),
        "ports": [{"name": "ssh", "containerPort": SSH_PORT, "protocol": "TCP"}],
        "resources": pod.resources,
        "volumeMounts": pod.mounts,
        "readinessProbe": {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 5, "failureThreshold": 3},
    }


def leader_worker_set_for(
    sdep: SpeculativeDeployment, pod: ServingPod, configmap: Mapping[str, Any], settings: OperatorSettings
) -> dict[str, Any]:
    """The LeaderWorkerSet of the serving pods `pod`, configured (and launched) by `configmap`."""
    spec = sdep.spec
    name = deployment_name(sdep)
    annotations = template_annotations(pod, configmap)
    metadata = child_metadata(sdep, SERVER_COMPONENT, group_set_name(sdep))
    topology = spec.placement.multi_node.exclusive_topology if spec.placement.multi_node else None
    if topology is not None:
        metadata["annotations"] = {EXCLUSIVE_TOPOLOGY_ANNOTATION: topology}
    return {
        "apiVersion": LWS_API_VERSION,
        "kind": "LeaderWorkerSet",
        "metadata": metadata,
        "spec": {
            "replicas": spec.replicas,
            "startupPolicy": "LeaderCreated",
            "rolloutStrategy": {
                "type": "RollingUpdate",
                "rollingUpdateConfiguration": {
                    "maxSurge": spec.rollout.max_surge,
                    "maxUnavailable": spec.rollout.max_unavailable,
                },
            },
            "networkConfig": {"subdomainPolicy": "Shared"},
            "leaderWorkerTemplate": {
                "size": spec.nodes_per_replica,
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": {
                    "metadata": {"labels": labels(name, SERVER_COMPONENT), "annotations": annotations},
                    "spec": pod_spec_for(sdep, pod, [_leader(sdep, pod, settings)]),
                },
                "workerTemplate": {
                    "metadata": {"labels": labels(name, WORKER_COMPONENT), "annotations": annotations},
                    "spec": pod_spec_for(sdep, pod, [_worker(sdep, pod)]),
                },
            },
        },
    }
