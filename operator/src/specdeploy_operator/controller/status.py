"""Status from observations: pure functions, no API calls.

`engine_build_status` turns a build Job and its pods into an EngineBuild status; `deployment_status` rolls
EngineBuilds, the serving Deployment and its pods up into a SpeculativeDeployment status. Conditions keep
their `lastTransitionTime` while their status stays the same, so an unchanged world gives an identical
status and the controller writes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from .podcreation import CREATION_REASONS, PodCreationProblem, deployment_creation_problem

__all__ = [
    "SPECULATION_EFFECTIVE",
    "ConditionSpec",
    "EngineObservation",
    "ServingObservation",
    "deployment_status",
    "engine_build_status",
    "hpa_report",
    "merge_conditions",
    "previous_engines",
    "rfc3339",
    "scheduling_problem",
    "termination_message",
]

Obj = Mapping[str, Any]

MAX_MESSAGE: Final = 4096


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class ConditionSpec:
    """A condition as computed now (the transition time is decided by `merge_conditions`)."""

    type: str
    status: str
    reason: str
    message: str


SPECULATION_EFFECTIVE: Final = "SpeculationEffective"


def merge_conditions(
    previous: Sequence[Obj] | None, current: Sequence[ConditionSpec], now: datetime, generation: int | None
) -> list[dict[str, Any]]:
    """Conditions in `current`'s order; a condition whose status did not change keeps its transition time."""
    old = {str(c.get("type")): c for c in previous or ()}
    merged: list[dict[str, Any]] = []
    for cond in current:
        before = old.get(cond.type)
        since = (
            before["lastTransitionTime"]
            if before is not None and before.get("status") == cond.status and before.get("lastTransitionTime")
            else rfc3339(now)
        )
        entry: dict[str, Any] = {"type": cond.type, "status": cond.status}
        if generation is not None:
            entry["observedGeneration"] = generation
        entry.update(
            {"lastTransitionTime": since, "reason": cond.reason, "message": cond.message[:MAX_MESSAGE]}
        )
        merged.append(entry)
    return merged


# -- pods -------------------------------------------------------------------------------------------------


def scheduling_problem(pod: Obj) -> str | None:
    """The scheduler's message when `pod` cannot be scheduled (PodScheduled False, reason Unschedulable)."""
    for cond in (pod.get("status") or {}).get("conditions") or ():
        scheduled = cond.get("type") == "PodScheduled" and cond.get("status") == "False"
        if scheduled and cond.get("reason") == "Unschedulable":
            return str(cond.get("message") or "Unschedulable")
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


def _is_ready(pod: Obj) -> bool:
    for cond in (pod.get("status") or {}).get("conditions") or ():
        if cond.get("type") == "Ready":
            return bool(cond.get("status") == "True")
    return False


def _by_creation(pods: Sequence[Obj]) -> list[Obj]:
    return sorted(pods, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))


# -- EngineBuild ------------------------------------------------------------------------------------------


def _job_condition(job: Obj, type_: str) -> Obj | None:
    for cond in (job.get("status") or {}).get("conditions") or ():
        if cond.get("type") == type_ and cond.get("status") == "True":
            return dict(cond)
    return None


def _in_progress(job_status: Obj, pods: Sequence[Obj], previous: Obj) -> tuple[str, str, str]:
    """(phase, reason, message) of a build Job that has neither completed nor failed."""
    live = [p for p in pods if (p.get("status") or {}).get("phase") in ("Pending", "Running")]
    running = [p for p in live if (p.get("status") or {}).get("phase") == "Running"]
    unschedulable = [m for m in (scheduling_problem(p) for p in live) if m]
    finished = [p for p in pods if (p.get("status") or {}).get("phase") == "Succeeded"]
    if running or finished or int(job_status.get("succeeded") or 0) > 0:
        phase, reason, message = "Running", "Building", "the build pod is running"
    elif unschedulable:
        phase, reason = "Pending", "Unschedulable"
        message = f"build pod cannot be scheduled: {unschedulable[0]}"
    elif previous.get("phase") == "Running" and not job_status.get("failed"):
        phase, reason, message = "Running", "Building", "the build pod is running"
    else:
        phase, reason, message = "Pending", "JobPending", "waiting for the build pod to start"
    last_failure = next(
        (m for m in (termination_message(p) for p in reversed(_by_creation(pods))) if m), None
    )
    if last_failure and job_status.get("failed"):
        message = f"{message} (retrying after {job_status['failed']} failed attempt(s): {last_failure})"
    return phase, reason, message


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
    if job is None:
        phase, reason, message = "Pending", "JobPending", "the build Job is being created"
        job_status: Obj = {}
        name = None
    else:
        name = job["metadata"]["name"]
        job_status = job.get("status") or {}
        complete = _job_condition(job, "Complete") or _job_condition(job, "SuccessCriteriaMet")
        failed = _job_condition(job, "Failed") or _job_condition(job, "FailureTarget")
        if complete is not None:
            phase, reason, message = "Succeeded", "BuildSucceeded", "engine built and written to the cache"
        elif failed is not None:
            phase, reason = "Failed", "BuildFailed"
            detail = next(
                (m for m in (termination_message(p) for p in reversed(_by_creation(pods))) if m), None
            )
            message = f"{failed.get('reason') or 'Failed'}: {failed.get('message') or 'the build Job failed'}"
            if detail:
                message = f"{message}; {detail}"
        else:
            phase, reason, message = _in_progress(job_status, pods, previous)
            # -- pod creation refused (issue #24) --
            if creation_problem is not None:
                phase, reason = "Pending", creation_problem.reason
                message = f"the build pod cannot be created: {creation_problem.message}"
    status: dict[str, Any] = {"phase": phase}
    if name:
        status["jobName"] = name
    if job is not None:
        # The Job reports Complete/SuccessCriteriaMet or FailureTarget before its counters catch up with the
        # last pod, and a finished EngineBuild is not looked at again: its pods count as attempts too.
        counted = sum(int(job_status.get(k) or 0) for k in ("active", "failed", "succeeded"))
        attempts = max(counted, len(pods))
        if phase == "Succeeded":
            attempts = max(attempts, int(job_status.get("failed") or 0) + 1)
        status["attempts"] = attempts
    if job_status.get("startTime"):
        status["startTime"] = job_status["startTime"]
    if phase == "Succeeded" and job_status.get("completionTime"):
        status["completionTime"] = job_status["completionTime"]
    elif phase == "Failed":
        failed_cond = _job_condition(job or {}, "Failed") or {}
        status["completionTime"] = failed_cond.get("lastTransitionTime") or rfc3339(now)
    status["message"] = message[:MAX_MESSAGE]
    succeeded = {"Succeeded": "True", "Failed": "False"}.get(phase, "Unknown")
    status["conditions"] = merge_conditions(
        previous.get("conditions"), [ConditionSpec("Succeeded", succeeded, reason, message)], now, None
    )
    return status


# -- SpeculativeDeployment --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EngineObservation:
    """One engine the deployment needs: the desired EngineBuild and what is observed of it."""

    role: str
    name: str
    hash: str
    observed: Obj | None

    @property
    def phase(self) -> str:
        return str(((self.observed or {}).get("status") or {}).get("phase") or "Pending")

    @property
    def reason(self) -> str:
        conditions = ((self.observed or {}).get("status") or {}).get("conditions") or ()
        return str(next((c.get("reason") for c in conditions if c.get("type") == "Succeeded"), "") or "")

    @property
    def message(self) -> str:
        return str(((self.observed or {}).get("status") or {}).get("message") or "")


@dataclass(frozen=True, slots=True)
class ServingObservation:
    """The serving Deployment (None before the first rollout) and its pods; `current` says whether the
    Deployment already carries the desired pod template."""

    deployment: Obj | None
    current: bool
    pods: Sequence[Obj] = field(default_factory=tuple)


def _engines_condition(engines: Sequence[EngineObservation]) -> tuple[ConditionSpec, str | None]:
    """EnginesReady and the phase it implies (None when every engine is built)."""
    failed = [e for e in engines if e.phase == "Failed"]
    if failed:
        text = "; ".join(f"EngineBuild {e.name} ({e.role}) failed: {e.message}" for e in failed)
        return ConditionSpec("EnginesReady", "False", "BuildFailed", text), "Failed"
    waiting = [e for e in engines if e.phase != "Succeeded"]
    if not waiting:
        names = ", ".join(e.name for e in engines) or "no engine build needed"
        return ConditionSpec("EnginesReady", "True", "EnginesBuilt", names), None
    blocked = [e for e in waiting if e.phase == "Pending" and e.reason in CREATION_REASONS]
    if blocked:
        text = "; ".join(f"{e.role} engine {e.name}: {e.message}" for e in blocked)
        return ConditionSpec("EnginesReady", "False", blocked[0].reason, text), "Building"
    running = any(e.phase == "Running" for e in waiting)
    text = "; ".join(
        f"{e.role} engine {e.name}: {e.phase}"
        + (f" ({e.message})" if e.phase == "Pending" and "Unschedulable" in e.reason else "")
        for e in waiting
    )
    if running:
        return ConditionSpec("EnginesReady", "False", "Building", text), "Building"
    return ConditionSpec("EnginesReady", "False", "BuildPending", text), "Pending"


def previous_engines(old: Obj | None, new: Obj, keep: int) -> list[str]:
    """EngineBuilds kept for rollback: engines the deployment used before (newest first), up to `keep` per
    role; an engine in use again leaves the list."""
    old = old or {}
    in_use = {str(ref["name"]) for role, ref in new.items() if role != "previous"}
    candidates = [
        str(ref["name"]) for role, ref in old.items() if role != "previous" and isinstance(ref, Mapping)
    ]
    candidates += [str(n) for n in old.get("previous") or ()]
    kept: list[str] = []
    for engine in candidates:
        if engine not in in_use and engine not in kept:
            kept.append(engine)
    roles = max(1, len(in_use))
    return kept[: keep * roles]


def _available(serving: ServingObservation, ready: int, desired: int) -> ConditionSpec:
    """Available follows the Deployment's own condition (it accounts for maxUnavailable)."""
    if serving.deployment is None:
        return ConditionSpec("Available", "False", "NotDeployed", "no serving pods yet")
    conditions = ((serving.deployment.get("status") or {}).get("conditions")) or ()
    cond = next((c for c in conditions if c.get("type") == "Available"), None)
    text = f"{ready} of {desired} replicas ready"
    if cond is not None and cond.get("status") == "True":
        return ConditionSpec("Available", "True", "MinimumReplicasAvailable", text)
    return ConditionSpec("Available", "False", "MinimumReplicasUnavailable", text)


def _rollout_done(desired: int, total: int, updated: int, ready: int, settled: bool) -> bool:
    """A rollout is done when only pods of the rendered template remain, all of them ready. A deployment
    already Ready at this generation (`settled`) stays Ready while surplus pods go away (a Deployment scaled
    up or its template edited by another actor, then reverted by the operator): the rendered pods never
    stopped serving, and the surplus is gone once the Deployment's controller has caught up."""
    if ready < desired:
        return False
    return (updated == desired and total == desired) or (settled and updated >= desired)


def _serving_verdict(
    problems: Sequence[str],
    capacity: Sequence[str],
    crashed: Sequence[str],
    *,
    creation: PodCreationProblem | None = None,
    rollout_done: bool,
    counts: tuple[int, int, int],
    gpus: str,
) -> tuple[str, ConditionSpec, ConditionSpec]:
    """Phase, Progressing and Degraded once the engines are built. `problems`: scheduler messages of pods
    that cannot be scheduled, `capacity`: those of them that only lack GPUs; `counts`: desired, updated and
    ready replicas; `gpus`: what the replicas wait for."""
    desired, updated, ready = counts
    if creation is not None:
        text = f"{ready} of {desired} replicas ready; serving pods cannot be created: {creation.message}"
        return (
            "Degraded",
            ConditionSpec("Progressing", "True", "RolloutInProgress", text),
            ConditionSpec("Degraded", "True", creation.reason, text),
        )
    blocked = [m for m in problems if m not in capacity]
    if blocked:
        text = f"{len(problems)} serving pod(s) cannot be scheduled: {blocked[0]}"
        return (
            "Degraded",
            ConditionSpec("Progressing", "True", "RolloutInProgress", text),
            ConditionSpec("Degraded", "True", "Unschedulable", text),
        )
    if capacity:
        text = (
            f"{len(capacity)} of {desired} replicas wait for capacity ({gpus}); "
            f"the scheduler says: {capacity[0]}"
        )
        return (
            "Degraded",
            ConditionSpec("Progressing", "True", "CapacityPending", text),
            ConditionSpec("Degraded", "True", "CapacityPending", text),
        )
    if rollout_done:
        text = f"{min(ready, desired)} of {desired} replicas ready"
        return (
            "Ready",
            ConditionSpec("Progressing", "False", "RolloutComplete", text),
            ConditionSpec("Degraded", "False", "AsExpected", ""),
        )
    text = f"{updated} of {desired} updated replicas, {ready} ready"
    if crashed:
        text = f"{text}; {crashed[0]}"
    return (
        "Deploying",
        ConditionSpec("Progressing", "True", "RolloutInProgress", text),
        ConditionSpec("Degraded", "False", "AsExpected", ""),
    )


def deployment_status(
    *,
    generation: int | None,
    desired_replicas: int,
    engines: Sequence[EngineObservation],
    serving: ServingObservation,
    selector: str,
    endpoint: str,
    gpus_per_replica: int,
    gpu_resource: str = "nvidia.com/gpu",
    autoscaler: Obj | None = None,
    previous: Obj | None,
    keep_previous: int,
    now: datetime,
    sync_error: str | None = None,
    sync_reason: str = "ReconcileError",
    speculation: Obj | None = None,
    speculation_condition: ConditionSpec | None = None,
) -> dict[str, Any]:
    """The SpeculativeDeployment status for what is observed; `autoscaler` is `status.autoscaler`;
    `sync_error` says why the last reconcile could not write what it wanted (condition `Synced`, reason
    `sync_reason`: `Forbidden` for a write RBAC refuses, else `ReconcileError`);
    `speculation` and its condition are the latest published figures (speculation.py), else the previous
    ones are kept (an operator that restarted has measured nothing yet)."""
    previous = previous or {}
    engines_cond, engine_phase = _engines_condition(engines)
    dep_status: Obj = (serving.deployment or {}).get("status") or {}
    total = int(dep_status.get("replicas") or 0)
    ready = int(dep_status.get("readyReplicas") or 0)
    updated = int(dep_status.get("updatedReplicas") or 0) if serving.current else 0
    pods = [p for p in serving.pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    # Pending for lack of what a replica consumes (the scheduler's "Insufficient nvidia.com/gpu"; for a
    # deployment on CPUs, 0 GPUs per replica, "Insufficient cpu" or "memory"): a cluster autoscaler adds
    # nodes for these; anything else (taints, selectors, other resources) needs a person.
    problems = [m for m in (scheduling_problem(p) for p in _by_creation(pods)) if m]
    lacking = (
        (f"Insufficient {gpu_resource}",)
        if gpus_per_replica > 0
        else ("Insufficient cpu", "Insufficient memory")
    )
    capacity = [m for m in problems if any(word in m for word in lacking)]
    available = _available(serving, ready, desired_replicas)

    if engine_phase == "Failed":
        phase = "Degraded" if ready > 0 else "Failed"
        progressing = ConditionSpec("Progressing", "False", "BuildFailed", engines_cond.message)
        degraded = ConditionSpec("Degraded", "True", "BuildFailed", engines_cond.message)
    elif engine_phase is not None:
        phase = engine_phase if engine_phase == "Pending" and serving.deployment is None else "Building"
        progressing = ConditionSpec("Progressing", "True", "Building", engines_cond.message)
        degraded = ConditionSpec("Degraded", "False", "AsExpected", "")
        if engines_cond.reason in CREATION_REASONS:  # a build pod cannot be created (issue #24)
            degraded = ConditionSpec("Degraded", "True", engines_cond.reason, engines_cond.message)
    else:
        settled = previous.get("phase") == "Ready" and previous.get("observedGeneration") == generation
        phase, progressing, degraded = _serving_verdict(
            problems,
            capacity,
            [m for m in (termination_message(p) for p in _by_creation(pods)) if m],
            creation=deployment_creation_problem(serving.deployment),
            rollout_done=serving.current and _rollout_done(desired_replicas, total, updated, ready, settled),
            counts=(desired_replicas, updated, ready),
            gpus=f"{gpus_per_replica} {gpu_resource} each" if gpus_per_replica > 0 else "CPU and memory",
        )

    status: dict[str, Any] = {"phase": phase}
    if generation is not None:
        status["observedGeneration"] = generation
    synced = (
        ConditionSpec("Synced", "False", sync_reason, sync_error)
        if sync_error is not None
        else ConditionSpec("Synced", "True", "ReconcileSuccess", "")
    )
    current = [engines_cond, available, progressing, degraded, synced]
    if speculation_condition is not None:
        current.append(speculation_condition)
    status["conditions"] = merge_conditions(previous.get("conditions"), current, now, generation)
    if speculation_condition is None:
        status["conditions"] += [
            c for c in previous.get("conditions") or () if c.get("type") == SPECULATION_EFFECTIVE
        ]
    refs: dict[str, Any] = {}
    for engine in engines:
        refs[engine.role] = {"name": engine.name, "hash": engine.hash, "phase": engine.phase}
    kept = previous_engines(previous.get("engines"), refs, keep_previous)
    if kept:
        refs["previous"] = kept
    if refs:
        status["engines"] = refs
    status.update(
        {
            "replicas": total,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "readyText": f"{ready}/{desired_replicas}",
            "selector": selector,
            "endpoint": endpoint,
            "gpusPerReplica": gpus_per_replica,
        }
    )
    if capacity:
        status["capacityPendingReplicas"] = len(capacity)
    if autoscaler is not None:
        status["autoscaler"] = dict(autoscaler)
    figures = speculation if speculation is not None else previous.get("speculation")
    if figures:
        status["speculation"] = dict(figures)
    return status


def hpa_report(hpa: Obj | None) -> dict[str, Any]:
    """What `status.autoscaler` repeats of a HorizontalPodAutoscaler's status: the replicas it asks for, and
    why it cannot scale when it cannot (its AbleToScale or ScalingActive condition is False)."""
    hpa_status: Obj = (hpa or {}).get("status") or {}
    report: dict[str, Any] = {}
    if "desiredReplicas" in hpa_status:
        report["desiredReplicas"] = int(hpa_status["desiredReplicas"])
    for cond in hpa_status.get("conditions") or ():
        if cond.get("type") in ("AbleToScale", "ScalingActive") and cond.get("status") == "False":
            report["message"] = f"{cond.get('reason')}: {cond.get('message') or ''}".strip()[:1024]
            break
    return report
