"""Reconciling one DraftTraining: observe it, its deployment and its Jobs, plan (`trainingplan.py`, pure),
create the Job the plan asks for; once trained, with `spec.promotion`, run the canary and decide
(`promotionplan.py`, pure); write the status."""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from specdeploy_operator.api import BuildPhase, DraftTraining, PromotionPhase, RunPhase, SpeculativeDeployment
from specdeploy_operator.builders import engine_builds
from specdeploy_operator.builders.canary import canary_children, canary_name, serving_trained

from .conditions import merge_conditions
from .kube import ObjectRef
from .port import ClusterPort, Obj, write_status
from .promotionplan import plan_promotion
from .trainingplan import TrainingObserved, plan_training

__all__ = ["promoted_draft", "reconcile_training"]

log = logging.getLogger(__name__)


async def reconcile_training(port: ClusterPort, namespace: str, name: str) -> float | None:
    body = port.observe("DraftTraining", namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return None
    deployment_name = (body.get("spec") or {}).get("deployment")
    deployment = (
        port.observe("SpeculativeDeployment", namespace, str(deployment_name)) if deployment_name else None
    )
    # The run's Job names come from its hash, which the plan computes: ask once for them, then observe them.
    names = plan_training(TrainingObserved(body, deployment), port.settings, port.now()).job_names
    jobs = {step: port.observe("Job", namespace, job) for step, job in names.items()}
    pods = {step: port.pods(namespace, "job", job) for step, job in names.items()}
    plan = plan_training(TrainingObserved(body, deployment, jobs, pods), port.settings, port.now())
    if plan.create is not None:
        _, created = await port.create_if_absent(plan.create)
        if created:
            log.info(
                "created draft-training Job",
                extra={"object": f"{namespace}/{name}", "job": plan.create["metadata"]["name"]},
            )
    status = plan.status
    retry = None
    if status.get("phase") == RunPhase.SUCCEEDED and (body.get("spec") or {}).get("promotion"):
        retry = await _promote(port, body, deployment, status)
    else:  # a new run (a changed spec) or no promotion asked: no canary of an earlier one stays
        await _end_canary(port, namespace, name)
    await write_status(port, body, status)
    return retry


async def _end_canary(port: ClusterPort, namespace: str, training: str) -> None:
    canary = canary_name(training)
    for kind, api in (("Deployment", "apps/v1"), ("ConfigMap", "v1")):
        if port.observe(kind, namespace, canary) is not None:
            await port.delete(ObjectRef(api, kind, namespace, canary))


async def _promote(
    port: ClusterPort, body: Obj, deployment: Obj | None, status: dict[str, Any]
) -> float | None:
    """The canary and its decision: `status.promotion` and the `Promoted` condition written into `status`."""
    training = DraftTraining.model_validate({k: body[k] for k in ("apiVersion", "kind", "metadata", "spec")})
    rule = training.spec.promotion
    assert rule is not None
    namespace, name = str(body["metadata"]["namespace"]), str(body["metadata"]["name"])
    children: list[dict[str, Any]] = []
    refused = None
    if deployment is None:
        refused = f"SpeculativeDeployment {training.spec.deployment} not found"
    else:
        try:
            sdep = SpeculativeDeployment.model_validate(
                {k: deployment[k] for k in ("apiVersion", "kind", "metadata", "spec")}
            )
            served = serving_trained(sdep, training.spec.draft, str(status.get("uri")))
            engines = engine_builds(served, port.settings)
            missing = [
                e.metadata.name
                for e in engines
                if (
                    (port.observe("EngineBuild", namespace, e.metadata.name or "") or {}).get("status") or {}
                ).get("phase")
                != BuildPhase.SUCCEEDED
            ]
            if missing:
                built = ", ".join(map(str, missing))
                refused = (
                    f"the canary needs engine builds the deployment has not built ({built}): it runs only "
                    "where the trained draft needs no build of its own"
                )
            else:
                children = canary_children(served, engines, body, port.settings)
        except (ValidationError, ValueError) as error:
            refused = str(error)
    now = port.now()
    promotion = plan_promotion(
        rule, (body.get("status") or {}).get("promotion"), port.canary_figures(namespace, name), now, refused
    )
    status["promotion"] = promotion.status
    status["conditions"] = _with(status, body, promotion.condition, now)
    if promotion.canary:
        for child in children:
            await port.ensure(child)
    else:
        await _end_canary(port, namespace, name)
    return promotion.requeue


def _with(status: Obj, body: Obj, condition: Any, now: datetime) -> list[dict[str, Any]]:
    """`status`'s conditions with the `Promoted` one merged in (its transition time kept while it holds)."""
    previous = (body.get("status") or {}).get("conditions")
    generation = (body.get("metadata") or {}).get("generation")
    promoted = merge_conditions(previous, [condition], now, generation)
    others = [c for c in status.get("conditions") or () if c.get("type") != str(condition.type)]
    return [*others, *promoted]


def promoted_draft(port: ClusterPort, sdep: SpeculativeDeployment) -> SpeculativeDeployment:
    """`sdep` as it serves: with the draft of its promoted DraftTraining (the latest decision, unless rolled
    back), else as it is."""
    namespace, name = sdep.metadata.namespace or "", sdep.metadata.name or ""
    chosen: tuple[str, Obj] | None = None
    for body in port.trainings_of(namespace, name):
        promotion = (body.get("status") or {}).get("promotion") or {}
        rule = (body.get("spec") or {}).get("promotion") or {}
        if (
            promotion.get("phase") != PromotionPhase.PROMOTED
            or rule.get("rollback")
            or not body["status"].get("uri")
        ):
            continue
        decided = str(promotion.get("decisionTime") or "")
        if chosen is None or decided > chosen[0]:
            chosen = (decided, body)
    if chosen is None:
        return sdep
    body = chosen[1]
    try:
        return serving_trained(sdep, str(body["spec"]["draft"]), str(body["status"]["uri"]))
    except ValueError as error:
        log.warning("promoted draft not served", extra={"object": f"{namespace}/{name}", "error": str(error)})
        return sdep
