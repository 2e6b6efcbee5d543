"""SpeculativeDeployment status from observations: pure functions, no API calls.

`deployment_status` rolls EngineBuilds, the serving Deployment and its pods up into a SpeculativeDeployment
status (an EngineBuild's own status is `buildstatus.py`'s). Conditions keep their `lastTransitionTime` while
their status stays the same, so an unchanged world gives an identical status and the controller writes
nothing. Phases, condition types and reasons are the API's vocabulary (`api.conditions`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from specdeploy_operator.api import (
    CREATION_REASONS,
    BuildPhase,
    ConditionStatus,
    ConditionType,
    DeploymentPhase,
    KubeCondition,
    Reason,
)

from . import passcosts
from .buildstatus import engine_build_status
from .conditions import ConditionSpec, find_condition, merge_conditions, rfc3339
from .podcreation import PodCreationProblem, deployment_creation_problem
from .podstate import by_creation, replicas_of, scheduling_problem, termination_message

__all__ = [
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

TRUE: Final = ConditionStatus.TRUE
FALSE: Final = ConditionStatus.FALSE


def _engines(status: ConditionStatus, reason: Reason, message: str) -> ConditionSpec:
    return ConditionSpec(ConditionType.ENGINES_READY, status, reason, message)


def _progressing(status: ConditionStatus, reason: Reason, message: str) -> ConditionSpec:
    return ConditionSpec(ConditionType.PROGRESSING, status, reason, message)


def _degraded(status: ConditionStatus, reason: Reason, message: str) -> ConditionSpec:
    return ConditionSpec(ConditionType.DEGRADED, status, reason, message)


@dataclass(frozen=True, slots=True)
class EngineObservation:
    """One engine the deployment needs: the desired EngineBuild and what is observed of it."""

    role: str
    name: str
    hash: str
    observed: Obj | None

    @property
    def phase(self) -> str:
        return str(((self.observed or {}).get("status") or {}).get("phase") or BuildPhase.PENDING)

    @property
    def reason(self) -> str:
        return str(
            find_condition((self.observed or {}).get("status"), ConditionType.SUCCEEDED).get("reason") or ""
        )

    @property
    def message(self) -> str:
        return str(((self.observed or {}).get("status") or {}).get("message") or "")


@dataclass(frozen=True, slots=True)
class ServingObservation:
    """The serving Deployment (None before the first rollout) and its pods; `current` says whether the
    Deployment already carries the desired pod template."""

    workload: Obj | None
    current: bool
    pods: Sequence[Obj] = field(default_factory=tuple)
    creation: PodCreationProblem | None = None
    """Why pods cannot be created, when the workload's controller says so only in events (a
    LeaderWorkerSet's StatefulSets); a Deployment says it in its own status."""


def _engines_condition(engines: Sequence[EngineObservation]) -> tuple[ConditionSpec, DeploymentPhase | None]:
    """EnginesReady and the phase it implies (None when every engine is built)."""
    failed = [e for e in engines if e.phase == BuildPhase.FAILED]
    if failed:
        text = "; ".join(f"EngineBuild {e.name} ({e.role}) failed: {e.message}" for e in failed)
        return _engines(FALSE, Reason.BUILD_FAILED, text), DeploymentPhase.FAILED
    waiting = [e for e in engines if e.phase != BuildPhase.SUCCEEDED]
    if not waiting:
        names = ", ".join(e.name for e in engines) or "no engine build needed"
        return _engines(TRUE, Reason.ENGINES_BUILT, names), None
    blocked = [e for e in waiting if e.phase == BuildPhase.PENDING and e.reason in CREATION_REASONS]
    if blocked:
        text = "; ".join(f"{e.role} engine {e.name}: {e.message}" for e in blocked)
        return _engines(FALSE, Reason(blocked[0].reason), text), DeploymentPhase.BUILDING
    running = any(e.phase == BuildPhase.RUNNING for e in waiting)
    text = "; ".join(
        f"{e.role} engine {e.name}: {e.phase}"
        + (f" ({e.message})" if e.phase == BuildPhase.PENDING and Reason.UNSCHEDULABLE in e.reason else "")
        for e in waiting
    )
    if running:
        return _engines(FALSE, Reason.BUILDING, text), DeploymentPhase.BUILDING
    return _engines(FALSE, Reason.BUILD_PENDING, text), DeploymentPhase.PENDING


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
    available = ConditionType.AVAILABLE
    if serving.workload is None:
        return ConditionSpec(available, FALSE, Reason.NOT_DEPLOYED, "no serving pods yet")
    cond = find_condition(serving.workload.get("status"), KubeCondition.DEPLOYMENT_AVAILABLE)
    text = f"{ready} of {desired} replicas ready"
    if cond.get("status") == TRUE:
        return ConditionSpec(available, TRUE, Reason.MINIMUM_REPLICAS_AVAILABLE, text)
    return ConditionSpec(available, FALSE, Reason.MINIMUM_REPLICAS_UNAVAILABLE, text)


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
    waiting: Sequence[str] = (),
) -> tuple[DeploymentPhase, ConditionSpec, ConditionSpec]:
    """Phase, Progressing and Degraded once the engines are built. `problems`: scheduler messages of pods
    that cannot be scheduled, `capacity`: those of them that only lack GPUs; `counts`: desired, updated and
    ready replicas; `gpus`: what the replicas wait for."""
    desired, updated, ready = counts
    if creation is not None:
        text = f"{ready} of {desired} replicas ready; serving pods cannot be created: {creation.message}"
        return (
            DeploymentPhase.DEGRADED,
            _progressing(TRUE, Reason.ROLLOUT_IN_PROGRESS, text),
            _degraded(TRUE, creation.reason, text),
        )
    blocked = [m for m in problems if m not in capacity]
    if blocked:
        text = f"{len(problems)} serving pod(s) cannot be scheduled: {blocked[0]}"
        return (
            DeploymentPhase.DEGRADED,
            _progressing(TRUE, Reason.ROLLOUT_IN_PROGRESS, text),
            _degraded(TRUE, Reason.UNSCHEDULABLE, text),
        )
    if capacity:
        groups = [w for w in waiting if w.startswith("group ")]
        named = f" ({', '.join(groups)})" if groups else ""
        text = (
            f"{len(waiting) or len(capacity)} of {desired} replicas{named} wait for capacity ({gpus}); "
            f"the scheduler says: {capacity[0]}"
        )
        return (
            DeploymentPhase.DEGRADED,
            _progressing(TRUE, Reason.CAPACITY_PENDING, text),
            _degraded(TRUE, Reason.CAPACITY_PENDING, text),
        )
    if rollout_done:
        text = f"{min(ready, desired)} of {desired} replicas ready"
        return (
            DeploymentPhase.READY,
            _progressing(FALSE, Reason.ROLLOUT_COMPLETE, text),
            _degraded(FALSE, Reason.AS_EXPECTED, ""),
        )
    text = f"{updated} of {desired} updated replicas, {ready} ready"
    if crashed:
        text = f"{text}; {crashed[0]}"
    return (
        DeploymentPhase.DEPLOYING,
        _progressing(TRUE, Reason.ROLLOUT_IN_PROGRESS, text),
        _degraded(FALSE, Reason.AS_EXPECTED, ""),
    )


def _building_verdict(
    engines_cond: ConditionSpec, engine_phase: DeploymentPhase, ready: int, serving: ServingObservation
) -> tuple[DeploymentPhase, ConditionSpec, ConditionSpec]:
    """Phase, Progressing and Degraded while an engine is not built (`engine_phase`: what EnginesReady
    implies)."""
    if engine_phase == DeploymentPhase.FAILED:
        phase = DeploymentPhase.DEGRADED if ready > 0 else DeploymentPhase.FAILED
        progressing = _progressing(FALSE, Reason.BUILD_FAILED, engines_cond.message)
        return phase, progressing, _degraded(TRUE, Reason.BUILD_FAILED, engines_cond.message)
    pending = engine_phase == DeploymentPhase.PENDING and serving.workload is None
    phase = engine_phase if pending else DeploymentPhase.BUILDING
    progressing = _progressing(TRUE, Reason.BUILDING, engines_cond.message)
    if engines_cond.reason in CREATION_REASONS:  # a build pod cannot be created
        return phase, progressing, _degraded(TRUE, engines_cond.reason, engines_cond.message)
    return phase, progressing, _degraded(FALSE, Reason.AS_EXPECTED, "")


def _what_replicas_need(gpus: int, nodes: int, resource: str) -> str:
    if gpus == 0:
        return "CPU and memory"
    if nodes == 1:
        return f"{gpus} {resource} each"
    return f"{gpus} {resource} each, on {nodes} nodes of {gpus // nodes}"


def deployment_status(
    *,
    generation: int | None,
    desired_replicas: int,
    engines: Sequence[EngineObservation],
    serving: ServingObservation,
    selector: str,
    endpoint: str,
    gpus_per_replica: int,
    model_name: str | None = None,
    nodes_per_replica: int = 1,
    gpu_resource: str = "nvidia.com/gpu",
    autoscaler: Obj | None = None,
    previous: Obj | None,
    keep_previous: int,
    now: datetime,
    sync_error: str | None = None,
    sync_reason: Reason = Reason.RECONCILE_ERROR,
    speculation: Obj | None = None,
    speculation_condition: ConditionSpec | None = None,
    cache_condition: ConditionSpec | None = None,
) -> dict[str, Any]:
    """The SpeculativeDeployment status for what is observed; `autoscaler` is `status.autoscaler`;
    `sync_error` says why the last reconcile could not write what it wanted (condition `Synced`, reason
    `sync_reason`: `Forbidden` for a write RBAC refuses, else `ReconcileError`);
    `speculation` and its condition are the latest published figures (speculation.py), else the previous
    ones are kept (an operator that restarted has measured nothing yet)."""
    previous = previous or {}
    engines_cond, engine_phase = _engines_condition(engines)
    dep_status: Obj = (serving.workload or {}).get("status") or {}
    total = int(dep_status.get("replicas") or 0)
    ready = int(dep_status.get("readyReplicas") or 0)
    updated = int(dep_status.get("updatedReplicas") or 0) if serving.current else 0
    pods = [p for p in serving.pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    # Pending for lack of what a replica consumes (the scheduler's "Insufficient nvidia.com/gpu"; for a
    # deployment on CPUs, 0 GPUs per replica, "Insufficient cpu" or "memory"): a cluster autoscaler adds
    # nodes for these; anything else (taints, selectors, other resources) needs a person.
    problems = [m for m in (scheduling_problem(p) for p in by_creation(pods)) if m]
    lacking = (
        (f"Insufficient {gpu_resource}",)
        if gpus_per_replica > 0
        else ("Insufficient cpu", "Insufficient memory")
    )
    capacity = [m for m in problems if any(word in m for word in lacking)]
    # A replica that spans nodes waits as a group: its pods are counted once, and the groups are named.
    waiting = replicas_of(
        [p for p in by_creation(pods) if any(word in (scheduling_problem(p) or "") for word in lacking)]
    )
    available = _available(serving, ready, desired_replicas)

    if engine_phase is not None:
        phase, progressing, degraded = _building_verdict(engines_cond, engine_phase, ready, serving)
    else:
        settled = (
            previous.get("phase") == DeploymentPhase.READY
            and previous.get("observedGeneration") == generation
        )
        phase, progressing, degraded = _serving_verdict(
            problems,
            capacity,
            [m for m in (termination_message(p) for p in by_creation(pods)) if m],
            creation=serving.creation or deployment_creation_problem(serving.workload),
            rollout_done=serving.current and _rollout_done(desired_replicas, total, updated, ready, settled),
            counts=(desired_replicas, updated, ready),
            gpus=_what_replicas_need(gpus_per_replica, nodes_per_replica, gpu_resource),
            waiting=waiting,
        )

    status: dict[str, Any] = {"phase": str(phase)}
    if generation is not None:
        status["observedGeneration"] = generation
    synced = (
        ConditionSpec(ConditionType.SYNCED, FALSE, sync_reason, sync_error)
        if sync_error is not None
        else ConditionSpec(ConditionType.SYNCED, TRUE, Reason.RECONCILE_SUCCESS, "")
    )
    current = [engines_cond, available, progressing, degraded, synced]
    if cache_condition is not None:
        current.append(cache_condition)
    if speculation_condition is not None:
        current.append(speculation_condition)
    status["conditions"] = merge_conditions(previous.get("conditions"), current, now, generation)
    if speculation_condition is None:
        status["conditions"] += [
            c
            for c in previous.get("conditions") or ()
            if c.get("type") == ConditionType.SPECULATION_EFFECTIVE
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
            **({"modelName": model_name} if model_name is not None else {}),
        }
    )
    if nodes_per_replica > 1:
        status["nodesPerReplica"] = nodes_per_replica
    if waiting:
        status["capacityPendingReplicas"] = len(waiting)
    if autoscaler is not None:
        status["autoscaler"] = dict(autoscaler)
    figures = speculation if speculation is not None else previous.get("speculation")
    if figures:
        status["speculation"] = dict(figures)
        # every size keeps the latest window that measured it (passcosts.py)
        costs = passcosts.merge(
            (previous.get("speculation") or {}).get("passCosts"), figures.get("passCosts")
        )
        if costs:
            status["speculation"]["passCosts"] = costs
    return status


def hpa_report(hpa: Obj | None) -> dict[str, Any]:
    """What `status.autoscaler` repeats of a HorizontalPodAutoscaler's status: the replicas it asks for, and
    why it cannot scale when it cannot (its AbleToScale or ScalingActive condition is False)."""
    hpa_status: Obj = (hpa or {}).get("status") or {}
    report: dict[str, Any] = {}
    if "desiredReplicas" in hpa_status:
        report["desiredReplicas"] = int(hpa_status["desiredReplicas"])
    for cond in hpa_status.get("conditions") or ():
        unable = cond.get("type") in (KubeCondition.HPA_ABLE_TO_SCALE, KubeCondition.HPA_SCALING_ACTIVE)
        if unable and cond.get("status") == FALSE:
            report["message"] = f"{cond.get('reason')}: {cond.get('message') or ''}".strip()[:1024]
            break
    return report
