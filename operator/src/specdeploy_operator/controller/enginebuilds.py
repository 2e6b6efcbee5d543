"""Reconciling one EngineBuild: observe, plan (`engineplan.py`, pure: garbage collection, the attempt and its
Job), apply through the cluster port, then write the status its Job and pods say (`buildstatus.py`)."""

from __future__ import annotations

import logging

from specdeploy_operator.api import API_VERSION
from specdeploy_operator.builders import job_name

from .buildstatus import engine_build_status
from .engineplan import (
    JOB_EVENTS_RETRY_SECONDS,
    TERMINAL,
    UNREFERENCED_ANNOTATION,
    is_terminal,
    plan_attempt,
    plan_collection,
)
from .kube import ObjectRef
from .podcreation import job_creation_problem, job_events_needed
from .port import ClusterPort, Obj, write_status

__all__ = ["TERMINAL", "UNREFERENCED_ANNOTATION", "reconcile_engine"]

log = logging.getLogger(__name__)


async def reconcile_engine(port: ClusterPort, namespace: str, name: str) -> float | None:
    body = port.observe("EngineBuild", namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return None
    collection = plan_collection(
        body, bool(port.users_of(namespace, name)), port.now(), port.settings.gc_grace_seconds
    )
    ref = ObjectRef(API_VERSION, "EngineBuild", namespace, name)
    if collection.mark is not None:
        await port.patch(ref, collection.mark)
    if collection.delete:
        await port.delete(ref, (body.get("metadata") or {}).get("uid"))
        log.info("deleted unused EngineBuild", extra={"object": f"{namespace}/{name}"})
        return None
    if not collection.in_use:
        return collection.wait
    if is_terminal(body):
        await _confirm_terminal(port, body)
        return None
    attempt = plan_attempt(body, port.settings)
    if attempt.old_job is not None:
        await port.delete(attempt.old_job)
        log.info("retrying build", extra={"object": f"{namespace}/{name}", "job": attempt.job_name})
    job, created = await port.create_if_absent(attempt.job)
    pods = port.pods(namespace, "job", attempt.job_name)
    # A Job whose pod the API server refuses (PodSecurity, a quota, a LimitRange) says so only in events.
    creation, retry = None, None
    if job_events_needed(job, pods):
        retry = JOB_EVENTS_RETRY_SECONDS
        if not created:
            events = await port.events_about(namespace, "Job", attempt.job_name)
            creation = job_creation_problem(job, pods, events)
    status = engine_build_status(job, pods, attempt.previous, port.now(), creation)
    await write_status(port, body, status)
    return retry


async def _confirm_terminal(port: ClusterPort, body: Obj) -> None:
    """A finished attempt's phase as its Job tells it, while the Job is there: a status someone edited by
    hand (`Failed` on a build whose Job completed, or the reverse) is written back. Once the Job is gone
    (its TTL) the status is all that is left of the attempt, and it is kept."""
    meta = body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    attempt = job_name(body)
    job = port.observe("Job", namespace, attempt)
    if job is None:
        return
    previous = dict(body.get("status") or {})
    status = engine_build_status(job, port.pods(namespace, "job", attempt), previous, port.now())
    if status["phase"] in TERMINAL and status["phase"] != previous.get("phase"):
        log.warning(
            "status contradicted the build Job; corrected",
            extra={"object": f"{namespace}/{name}", "was": previous.get("phase"), "job": status["phase"]},
        )
        await write_status(port, body, status)
