"""Why pods cannot be created: pure functions over what the controllers report.

When the API server refuses a pod (PodSecurity admission, a ResourceQuota, a LimitRange, any other admission
refusal), no pod exists to look at. Its controller says so instead:

- a Deployment copies its ReplicaSet's `ReplicaFailure` condition (reason `FailedCreate`, the API server's
  message) into its own status, and removes it once a pod is created again;
- a Job has no such condition: the Job controller posts a `FailedCreate` event on the Job (and
  `SuccessfulCreate` when a pod is created), so the newest of those events tells;
- a LeaderWorkerSet neither: its StatefulSets (the leaders' one, named like the set, and each group's workers'
  one, `<set>-<group index>`) get the StatefulSet controller's `FailedCreate`/`SuccessfulCreate` events.

The reason names the cause: `QuotaExceeded` for a ResourceQuota, `PodCreationForbidden` for any other refusal
(`... is forbidden: ...`: PodSecurity, LimitRange, a webhook), `PodCreationFailed` for the rest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from specdeploy_operator.api import (
    CREATION_REASONS,
    ConditionStatus,
    ConditionType,
    DeploymentPhase,
    KubeCondition,
    KubeReason,
    PodPhase,
    Reason,
)
from specdeploy_operator.builders.leaderworkerset import GROUP_INDEX_LABEL, WORKER_INDEX_LABEL

__all__ = [
    "CREATION_REASONS",
    "GROUP_EVENTS_GRACE_SECONDS",
    "PodCreationProblem",
    "classify",
    "creation_event",
    "deployment_creation_problem",
    "events_creation_problem",
    "group_events_wait",
    "group_sets_to_ask",
    "job_creation_problem",
    "job_events_needed",
]

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class PodCreationProblem:
    """A refused pod creation: `reason` (one of `CREATION_REASONS`) and the API server's message."""

    reason: Reason
    message: str


def classify(message: str) -> Reason:
    """The reason for an API server's refusal `message`."""
    if "exceeded quota" in message or "failed quota" in message:
        return Reason.QUOTA_EXCEEDED
    if "forbidden" in message:
        return Reason.POD_CREATION_FORBIDDEN
    return Reason.POD_CREATION_FAILED


def _problem(message: str) -> PodCreationProblem:
    text = message.strip() or "the API server refused to create a pod"
    return PodCreationProblem(classify(text), text)


def deployment_creation_problem(deployment: Obj | None) -> PodCreationProblem | None:
    """The Deployment's `ReplicaFailure` condition, when it is True."""
    conditions = ((deployment or {}).get("status") or {}).get("conditions") or ()
    for cond in conditions:
        if (
            cond.get("type") == KubeCondition.DEPLOYMENT_REPLICA_FAILURE
            and cond.get("status") == ConditionStatus.TRUE
        ):
            return _problem(str(cond.get("message") or cond.get("reason") or ""))
    return None


def _live(pod: Obj) -> bool:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    return not meta.get("deletionTimestamp") and status.get("phase") in (
        PodPhase.PENDING,
        PodPhase.RUNNING,
        None,
    )


_JOB_FINISHED = (
    KubeCondition.JOB_COMPLETE,
    KubeCondition.JOB_FAILED,
    KubeCondition.JOB_SUCCESS_CRITERIA_MET,
    KubeCondition.JOB_FAILURE_TARGET,
)


def _finished(job: Obj) -> bool:
    return any(
        c.get("status") == ConditionStatus.TRUE and c.get("type") in _JOB_FINISHED
        for c in (job.get("status") or {}).get("conditions") or ()
    )


def job_events_needed(job: Obj | None, pods: Sequence[Obj]) -> bool:
    """Whether the Job's events must be read: it runs, and has no pod that lives (created and not done)."""
    if job is None or _finished(job) or any(_live(p) for p in pods):
        return False
    return int((job.get("status") or {}).get("active") or 0) == 0


def _event_time(event: Obj) -> str:
    meta = event.get("metadata") or {}
    return str(event.get("lastTimestamp") or event.get("eventTime") or meta.get("creationTimestamp") or "")


def job_creation_problem(
    job: Obj | None, pods: Sequence[Obj], events: Sequence[Obj]
) -> PodCreationProblem | None:
    """The newest `FailedCreate` event of `job` (events about it, any order), unless a pod was created
    since (a `SuccessfulCreate` event as new or newer) or a pod of the Job lives."""
    if not job_events_needed(job, pods):
        return None
    return events_creation_problem(events, ((job or {}).get("metadata") or {}).get("uid"))


GROUP_EVENTS_GRACE_SECONDS: Final = 10.0
"""How long a LeaderWorkerSet's missing pods are taken for pods on their way (its controller and the
StatefulSets' create them within seconds) before the StatefulSets' events are read for a refusal."""


def _created(obj: Obj) -> datetime | None:
    stamp = (obj.get("metadata") or {}).get("creationTimestamp")
    return datetime.fromisoformat(str(stamp).replace("Z", "+00:00")) if stamp else None


def group_events_wait(workload: Obj, pods: Sequence[Obj], now: datetime) -> float:
    """Seconds until missing pods of the LeaderWorkerSet `workload` count as refused rather than on their way:
    the grace period from its creation or its newest pod's, whichever came last (0: ask now)."""
    moments = [m for m in (_created(workload), *(_created(p) for p in pods)) if m is not None]
    if not moments:
        return 0.0
    return max(0.0, GROUP_EVENTS_GRACE_SECONDS - (now - max(moments)).total_seconds())


def group_sets_to_ask(workload: Obj | None, pods: Sequence[Obj]) -> list[str]:
    """The StatefulSets of a LeaderWorkerSet `workload` whose events must be read: the leaders' while fewer
    leaders live than there are groups, and a group's workers' while its leader lives with fewer workers than
    the group needs. None for a Deployment, or while every pod the groups need lives."""
    if workload is None or workload.get("kind") != "LeaderWorkerSet":
        return []
    spec = workload.get("spec") or {}
    groups = int(spec.get("replicas") or 0)
    size = int((spec.get("leaderWorkerTemplate") or {}).get("size") or 1)
    name = str((workload.get("metadata") or {}).get("name") or "")
    leaders: set[str] = set()
    workers: dict[str, int] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        group = labels.get(GROUP_INDEX_LABEL)
        if group is None or not _live(pod):
            continue
        if labels.get(WORKER_INDEX_LABEL) == "0":
            leaders.add(group)
        else:
            workers[group] = workers.get(group, 0) + 1
    sets = [name] if len(leaders) < groups else []
    return sets + [f"{name}-{g}" for g in sorted(leaders, key=int) if workers.get(g, 0) < size - 1]


def events_creation_problem(events: Sequence[Obj], uid: str | None = None) -> PodCreationProblem | None:
    """The newest `FailedCreate` of `events` (about one controller: of `uid`, when given), unless a pod was
    created as recently (`SuccessfulCreate`)."""
    relevant = [
        e
        for e in events
        if e.get("reason") in (KubeReason.JOB_FAILED_CREATE, KubeReason.JOB_SUCCESSFUL_CREATE)
        and (not uid or ((e.get("involvedObject") or {}).get("uid") in (None, "", uid)))
    ]
    if not relevant:
        return None
    # On equal times (one-second resolution) a success wins: the pod exists.
    newest = max(
        relevant, key=lambda e: (_event_time(e), e.get("reason") == KubeReason.JOB_SUCCESSFUL_CREATE)
    )
    if newest.get("reason") != KubeReason.JOB_FAILED_CREATE:
        return None
    return _problem(str(newest.get("message") or ""))


def creation_event(previous: Obj, status: Obj) -> tuple[Reason, str] | None:
    """(reason, message) of the Warning event to post when a status write newly says that pods cannot be
    created: its `Degraded` (SpeculativeDeployment) or `Succeeded` (EngineBuild) condition took one of
    `CREATION_REASONS`. None when nothing new; a SpeculativeDeployment whose phase is `Degraded` gets that
    event from the phase change already."""
    if status.get("phase") == DeploymentPhase.DEGRADED:
        return None

    def creation(conditions: Any) -> tuple[Reason, str] | None:
        for cond in conditions or ():
            kinds = (ConditionType.DEGRADED, ConditionType.SUCCEEDED)
            if cond.get("type") in kinds and cond.get("reason") in CREATION_REASONS:
                return Reason(cond["reason"]), str(cond.get("message") or "")
        return None

    now, before = creation(status.get("conditions")), creation(previous.get("conditions"))
    if now is None or (before is not None and before[0] == now[0]):
        return None
    return now
