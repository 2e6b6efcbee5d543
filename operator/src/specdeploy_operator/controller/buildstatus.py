"""EngineBuild status from its build Job and the Job's pods. Pure; the phase, condition and reasons are the
API's vocabulary."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from specdeploy_operator.api import (
    BuildPhase,
    ConditionStatus,
    ConditionType,
    KubeCondition,
    PodPhase,
    Reason,
)

from .conditions import MAX_MESSAGE, ConditionSpec, merge_conditions, rfc3339
from .podcreation import PodCreationProblem
from .podstate import by_creation, scheduling_problem, termination_message

__all__ = ["engine_build_status"]

Obj = Mapping[str, Any]


def _job_condition(job: Obj, type_: KubeCondition) -> Obj | None:
    for cond in (job.get("status") or {}).get("conditions") or ():
        if cond.get("type") == type_ and cond.get("status") == ConditionStatus.TRUE:
            return dict(cond)
    return None


def _last_failure(pods: Sequence[Obj]) -> str | None:
    """The termination message of the newest pod that failed."""
    return next((m for m in (termination_message(p) for p in reversed(by_creation(pods))) if m), None)


def _pod_phase(pod: Obj) -> str | None:
    return (pod.get("status") or {}).get("phase")


def _in_progress(job_status: Obj, pods: Sequence[Obj], previous: Obj) -> tuple[BuildPhase, Reason, str]:
    """(phase, reason, message) of a build Job that has neither completed nor failed."""
    live = [p for p in pods if _pod_phase(p) in (PodPhase.PENDING, PodPhase.RUNNING)]
    running = [p for p in live if _pod_phase(p) == PodPhase.RUNNING]
    unschedulable = [m for m in (scheduling_problem(p) for p in live) if m]
    finished = [p for p in pods if _pod_phase(p) == PodPhase.SUCCEEDED]
    phase: BuildPhase
    if running or finished or int(job_status.get("succeeded") or 0) > 0:
        phase, reason, message = BuildPhase.RUNNING, Reason.BUILDING, "the build pod is running"
    elif unschedulable:
        phase, reason = BuildPhase.PENDING, Reason.UNSCHEDULABLE
        message = f"build pod cannot be scheduled: {unschedulable[0]}"
    elif previous.get("phase") == BuildPhase.RUNNING and not job_status.get("failed"):
        phase, reason, message = BuildPhase.RUNNING, Reason.BUILDING, "the build pod is running"
    else:
        phase, reason, message = BuildPhase.PENDING, Reason.JOB_PENDING, "waiting for the build pod to start"
    last_failure = _last_failure(pods)
    if last_failure and job_status.get("failed"):
        message = f"{message} (retrying after {job_status['failed']} failed attempt(s): {last_failure})"
    return phase, reason, message


def _verdict(
    job: Obj, job_status: Obj, pods: Sequence[Obj], previous: Obj, creation_problem: PodCreationProblem | None
) -> tuple[BuildPhase, Reason, str]:
    """(phase, reason, message) of an existing build Job."""
    complete = _job_condition(job, KubeCondition.JOB_COMPLETE) or _job_condition(
        job, KubeCondition.JOB_SUCCESS_CRITERIA_MET
    )
    failed = _job_condition(job, KubeCondition.JOB_FAILED) or _job_condition(
        job, KubeCondition.JOB_FAILURE_TARGET
    )
    if complete is not None:
        return BuildPhase.SUCCEEDED, Reason.BUILD_SUCCEEDED, "engine built and written to the cache"
    if failed is not None:
        message = f"{failed.get('reason') or 'Failed'}: {failed.get('message') or 'the build Job failed'}"
        detail = _last_failure(pods)
        return BuildPhase.FAILED, Reason.BUILD_FAILED, f"{message}; {detail}" if detail else message
    if creation_problem is not None:  # the Job's pod is refused: pending, with the API server's reason
        return (
            BuildPhase.PENDING,
            creation_problem.reason,
            f"the build pod cannot be created: {creation_problem.message}",
        )
    return _in_progress(job_status, pods, previous)


def engine_build_status(
    job: Obj | None,
    pods: Sequence[Obj],
    previous: Obj | None,
    now: datetime,
    creation_problem: PodCreationProblem | None = None,
) -> dict[str, Any]:
    """EngineBuild status from its Job (None: not created yet) and the Job's pods; `creation_problem`: why
    the Job's pod cannot be created (podcreation.job_creation_problem)."""
    previous = previous or {}
    job_status: Obj = (job or {}).get("status") or {}
    if job is None:
        phase, reason, message = BuildPhase.PENDING, Reason.JOB_PENDING, "the build Job is being created"
    else:
        phase, reason, message = _verdict(job, job_status, pods, previous, creation_problem)
    status: dict[str, Any] = {"phase": str(phase)}
    if job is not None and job["metadata"]["name"]:
        status["jobName"] = job["metadata"]["name"]
    if job is not None:
        # The Job reports Complete/SuccessCriteriaMet or FailureTarget before its counters catch up with the
        # last pod, and a finished EngineBuild is not looked at again: its pods count as attempts too.
        counted = sum(int(job_status.get(k) or 0) for k in ("active", "failed", "succeeded"))
        attempts = max(counted, len(pods))
        if phase == BuildPhase.SUCCEEDED:
            attempts = max(attempts, int(job_status.get("failed") or 0) + 1)
        status["attempts"] = attempts
    if job_status.get("startTime"):
        status["startTime"] = job_status["startTime"]
    if phase == BuildPhase.SUCCEEDED and job_status.get("completionTime"):
        status["completionTime"] = job_status["completionTime"]
    elif phase == BuildPhase.FAILED:
        failed_cond = _job_condition(job or {}, KubeCondition.JOB_FAILED) or {}
        status["completionTime"] = failed_cond.get("lastTransitionTime") or rfc3339(now)
    status["message"] = message[:MAX_MESSAGE]
    succeeded = {BuildPhase.SUCCEEDED: ConditionStatus.TRUE, BuildPhase.FAILED: ConditionStatus.FALSE}.get(
        phase, ConditionStatus.UNKNOWN
    )
    condition = ConditionSpec(ConditionType.SUCCEEDED, succeeded, reason, message)
    status["conditions"] = merge_conditions(previous.get("conditions"), [condition], now, None)
    return status
