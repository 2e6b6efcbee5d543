"""Reconciling one SpeculativeDeployment: observe, plan (`deploymentplan.py`, pure), apply the plan through
the cluster port (engines, engine cache, serving objects, autoscaler, in that order), then write the status
that reports what was found. Every write goes through the port, which compares with the live object and writes
only what differs.

A write the API server refuses does not stop the report: the status says which step failed and why
(condition `Synced`), then `ReconcileFailed` makes the work queue retry with back-off.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

from pydantic import ValidationError

from specdeploy_operator.api import (
    ClaimPhase,
    ConditionStatus,
    EngineBuild,
    EventType,
    Reason,
    SpeculativeDeployment,
)
from specdeploy_operator.builders import cache_pvc_name, engine_builds, group_set_name

from . import metrics
from .cachestatus import CACHE_RETRY_SECONDS, cache_condition
from .conditions import ConditionSpec
from .deploymentplan import (
    AutoscalerPlan,
    DeploymentPlan,
    Observed,
    Outcome,
    ServingPlan,
    deployment_current,
    deployment_report,
    invalid_status,
    leaders_current,
    may_retire,
    plan_deployment,
    retired_event,
    template_changed,
)
from .events import Event
from .kube import ApiError, ref_of
from .podcreation import events_creation_problem, group_events_wait, group_sets_to_ask
from .port import ClusterPort, Obj, write_status
from .status import EngineObservation, hpa_report
from .trainings import promoted_draft

__all__ = ["AUTOSCALER_RETRY_SECONDS", "ReconcileFailed", "reconcile_deployment"]

log = logging.getLogger(__name__)

SDEP = "SpeculativeDeployment"


class ReconcileFailed(Exception):
    """A reconcile that could not do everything; its status already says why. The queue retries it."""


AUTOSCALER_RETRY_SECONDS = 60.0
"""How soon a ScaledObject that could not be created (KEDA not installed) is tried again."""


async def reconcile_deployment(port: ClusterPort, namespace: str, name: str) -> float | None:
    body = port.observe(SDEP, namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return None
    try:
        sdep = SpeculativeDeployment.model_validate(body)
    except ValidationError as invalid:
        # Admitted by the API server, rejected by the model (an older CRD version): reported, nothing touched.
        await write_status(port, body, invalid_status(body, invalid, port.now()))
        return None
    sdep = promoted_draft(port, sdep)  # a DraftTraining's promoted draft replaces the spec's
    engines = engine_builds(sdep, port.settings)
    deployment = port.observe("Deployment", namespace, name)
    group_set = port.observe("LeaderWorkerSet", namespace, group_set_name(sdep))
    groups = sdep.spec.nodes_per_replica > 1
    observed = Observed(
        engines={
            e.metadata.name or "": port.observe("EngineBuild", namespace, e.metadata.name or "")
            for e in engines
        },
        workload=group_set if groups else deployment,
        hpa=port.observe("HorizontalPodAutoscaler", namespace, name),
        retired=deployment if groups else group_set,
    )
    plan = plan_deployment(sdep, body, engines, observed, port.settings)
    applied = await _apply(port, body, plan, observed)
    if applied is None:
        return None
    outcome, retry = applied
    pods = port.pods(namespace, "serving", name)
    children = plan.serving.children
    if outcome.current and children is not None and not leaders_current(children.workload, pods):
        outcome = replace(outcome, current=False)  # the groups still roll to the new template
    creation = None
    asked = group_sets_to_ask(outcome.workload, pods)  # only while a group's pods are missing ...
    if asked and outcome.workload is not None:
        wait = group_events_wait(outcome.workload, pods, port.now())  # ... for longer than they take to come
        if wait > 0:
            retry = wait if retry is None else min(retry, wait)
        else:
            events = [e for s in asked for e in await port.events_about(namespace, "StatefulSet", s)]
            creation = events_creation_problem(events)
    cache = await _cache_condition(port, sdep) if engines else None
    if cache is not None and cache.status != ConditionStatus.TRUE:
        retry = CACHE_RETRY_SECONDS if retry is None else min(retry, CACHE_RETRY_SECONDS)
    report = deployment_report(
        sdep,
        body,
        outcome=outcome,
        pods=pods,
        creation=creation,
        cache=cache,
        speculation=port.speculation_figures(namespace, name),
        settings=port.settings,
        now=port.now(),
    )
    status = report.status if report is not None else body.get("status") or {}
    metrics.record_deployment(namespace, name, sdep.spec.replicas, int(status.get("readyReplicas") or 0))
    if report is not None:
        await write_status(port, body, report.status, report.quiet)
        for event in report.events:
            await port.event(body, event)
    if outcome.error is not None:
        raise ReconcileFailed(outcome.error)
    return retry


async def _cache_condition(port: ClusterPort, sdep: SpeculativeDeployment) -> ConditionSpec:
    """`EngineCacheReady` of the deployment's engine-cache claim; the events about the claim are read (one
    request) only while it is not bound."""
    namespace = sdep.metadata.namespace or ""
    name = cache_pvc_name(sdep, port.settings)
    claim = port.observe("PersistentVolumeClaim", namespace, name)
    bound = claim is not None and (claim.get("status") or {}).get("phase") == ClaimPhase.BOUND
    events = (
        [] if claim is None or bound else await port.events_about(namespace, "PersistentVolumeClaim", name)
    )
    user_claim = sdep.spec.engine_cache is not None and sdep.spec.engine_cache.pvc_name is not None
    return cache_condition(name, claim, events, user_claim=user_claim)


@dataclass
class _Progress:
    """What the apply has found so far (a failure keeps what came before it)."""

    engines: list[EngineObservation]
    workload: Obj | None
    current: bool = False
    rollout_started: bool = False
    autoscaler: dict[str, Any] | None = None
    retry: float | None = None


async def _apply(
    port: ClusterPort, body: Obj, plan: DeploymentPlan, observed: Observed
) -> tuple[Outcome, float | None] | None:
    """Apply `plan` step by step; None when the namespace is being deleted (nothing to create or report)."""
    meta = body["metadata"]
    namespace, name = str(meta.get("namespace") or ""), str(meta["name"])
    progress = _Progress(observed.engine_observations(plan.engines), observed.workload)
    step = "engines"
    try:
        progress.engines = await _apply_engines(port, plan.engines)
        step = "engine cache"
        if plan.cache is not None:
            await (port.create_if_absent if plan.cache.shared else port.ensure)(plan.cache.claim)
        step = "serving objects"
        await _apply_serving(port, body, plan.serving, progress)
        step = "autoscaler"
        progress.autoscaler, progress.retry = await _apply_autoscaler(port, body, plan.autoscaler)
    except Exception as failure:  # reported in status, then retried with back-off by the queue
        if isinstance(failure, ApiError) and failure.namespace_terminating:
            # The namespace is being deleted and this deployment with it: nothing to create or report; the
            # reconciler pauses work in the namespace (TERMINATING_PAUSE_SECONDS) instead of retrying.
            log.info("namespace terminating; not reconciled", extra={"object": f"{namespace}/{name}"})
            port.namespace_terminating(namespace)
            return None
        reason = failure.reason if isinstance(failure, ApiError) else f"{type(failure).__name__}: {failure}"
        error = f"reconciling the {step} failed: {reason}"
        sync_reason = Reason.RECONCILE_ERROR
        if isinstance(failure, ApiError) and failure.rbac_denied:
            sync_reason = Reason.FORBIDDEN
            error += " (the operator's Role or ClusterRole lacks this permission: see the chart's rbac.yaml)"
        log.warning("reconcile failed", extra={"object": f"{namespace}/{name}", "error": error})
        children = plan.serving.children
        if not progress.current and step != "autoscaler":
            # The failure came before the Deployment was looked at: whether it is current is read from it,
            # so that a refused repair of another child does not report a Ready deployment as rolling out.
            progress.current = children is not None and deployment_current(
                progress.workload, children.workload
            )
        return _outcome(progress, error, sync_reason), None
    return _outcome(progress, None, Reason.RECONCILE_ERROR), progress.retry


def _outcome(progress: _Progress, error: str | None, sync_reason: Reason) -> Outcome:
    return Outcome(
        engines=progress.engines,
        workload=progress.workload,
        current=progress.current,
        rollout_started=progress.rollout_started,
        autoscaler=progress.autoscaler,
        error=error,
        sync_reason=sync_reason,
    )


async def _apply_engines(port: ClusterPort, engines: tuple[EngineBuild, ...]) -> list[EngineObservation]:
    """Create the EngineBuilds that do not exist yet (shared ones are found by name); their observations."""
    observations: list[EngineObservation] = []
    for engine in engines:
        name = engine.metadata.name or ""
        observed, created = await port.create_if_absent(engine)
        if created:
            port.enqueue(("engine", engine.metadata.namespace or "", name))
        observations.append(EngineObservation(engine.spec.role, name, engine.spec.hash, observed))
    return observations


async def _apply_serving(port: ClusterPort, body: Obj, plan: ServingPlan, progress: _Progress) -> None:
    """ConfigMap, Service, PDB and Deployment once every engine is built; until then the replica count."""
    before = progress.workload
    if plan.children is None:
        if before is not None and plan.replicas is not None:
            progress.workload = await port.patch(ref_of(before), {"spec": {"replicas": plan.replicas}})
        return
    children = plan.children
    for child in (children.configmap, children.service, children.pdb):
        await port.ensure(child)
    progress.workload, applied = await port.ensure(children.workload)
    progress.rollout_started = applied and template_changed(before, children.workload)
    if progress.rollout_started:
        await port.event(body, plan.rollout)
    progress.current = deployment_current(progress.workload, children.workload) and not (
        progress.rollout_started and children.workload["kind"] == "LeaderWorkerSet"
    )
    retired, workload = plan.retire, progress.workload
    if retired is not None and workload is not None and may_retire(workload, progress.current):
        await port.delete(ref_of(retired), (retired.get("metadata") or {}).get("uid"))
        await port.event(body, retired_event(retired, workload))


async def _apply_autoscaler(
    port: ClusterPort, body: Obj, plan: AutoscalerPlan
) -> tuple[dict[str, Any] | None, float | None]:
    """Create or update the autoscaler and delete one that is no longer asked for; `status.autoscaler` and,
    when creating it failed, when to try again."""
    if plan.remove_hpa is not None:
        await port.delete(ref_of(plan.remove_hpa), (plan.remove_hpa.get("metadata") or {}).get("uid"))
    if plan.remove_scaled_object is not None:
        await port.delete(plan.remove_scaled_object)
    if plan.desired is None or plan.report is None:
        return None, None
    report: dict[str, Any] = dict(plan.report)
    if plan.desired["kind"] == "HorizontalPodAutoscaler":
        result, _ = await port.ensure(plan.desired)
        report.update(hpa_report(result))
        return report, None
    try:
        await port.ensure(plan.desired)
    except ApiError as error:
        if error.status not in (403, 404):
            raise
        report["message"] = plan.refusal(error.status)
        previous = (body.get("status") or {}).get("autoscaler") or {}
        if previous.get("message") != report["message"]:
            await port.event(body, Event(EventType.WARNING, Reason.AUTOSCALER_FAILED, str(report["message"])))
        return report, AUTOSCALER_RETRY_SECONDS
    return report, None
