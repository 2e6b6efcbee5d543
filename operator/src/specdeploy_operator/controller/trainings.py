"""Reconciling one DraftTraining: observe it, its deployment and its Jobs, plan (`trainingplan.py`, pure),
create the Job the plan asks for, and write the status it says."""

from __future__ import annotations

import logging

from .port import ClusterPort, write_status
from .trainingplan import TrainingObserved, plan_training

__all__ = ["reconcile_training"]

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
    await write_status(port, body, plan.status)
    return None
