"""What the pods of a build Job or a serving Deployment say about themselves: why they cannot be scheduled,
why they terminated. Pure functions over pod objects."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from specdeploy_operator.api import ConditionStatus, KubeCondition, KubeReason
from specdeploy_operator.builders.leaderworkerset import GROUP_INDEX_LABEL

__all__ = ["by_creation", "replicas_of", "scheduling_problem", "termination_message"]

Obj = Mapping[str, Any]


def scheduling_problem(pod: Obj) -> str | None:
    """The scheduler's message when `pod` cannot be scheduled (PodScheduled False, reason Unschedulable)."""
    for cond in (pod.get("status") or {}).get("conditions") or ():
        scheduled = (
            cond.get("type") == KubeCondition.POD_SCHEDULED and cond.get("status") == ConditionStatus.FALSE
        )
        if scheduled and cond.get("reason") == KubeReason.POD_UNSCHEDULABLE:
            return str(cond.get("message") or KubeReason.POD_UNSCHEDULABLE)
    return None


def termination_message(pod: Obj) -> str | None:
    """`container: reason (exit N): message` for each container of `pod` that terminated unsuccessfully."""
    status = pod.get("status") or {}
    parts: list[str] = []
    for container in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]:
        terminated = (container.get("state") or {}).get("terminated") or {}
        code = terminated.get("exitCode")
        if terminated and code not in (None, 0):
            text = f"{container.get('name')}: {terminated.get('reason') or 'Error'} (exit {code})"
            message = str(terminated.get("message") or "").strip()
            parts.append(f"{text}: {message}" if message else text)
    return "; ".join(parts) or None


def by_creation(pods: Sequence[Obj]) -> list[Obj]:
    """`pods`, oldest first (ties by name)."""
    return sorted(pods, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))


def replicas_of(pods: Sequence[Obj]) -> list[str]:
    """The replicas `pods` belong to, each once, in the order of `pods`: `group <index>` for the pods of a
    LeaderWorkerSet group, the pod's name for a pod that is a replica by itself."""
    replicas: list[str] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        group = (meta.get("labels") or {}).get(GROUP_INDEX_LABEL)
        replica = f"group {group}" if group is not None else str(meta.get("name"))
        if replica not in replicas:
            replicas.append(replica)
    return replicas
