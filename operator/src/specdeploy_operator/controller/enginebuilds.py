"""Reconciling one EngineBuild: an explicit lifecycle, decided from the EngineBuild and its Job.

    Pending -> Running -> Succeeded | Failed          (one attempt = one Job, named by `job_name`)

`Succeeded` and `Failed` are terminal for the attempt that reached them (`status.jobName`): nothing is
inferred from the Job's absence afterwards, so a finished Job that its TTL (or a person) deleted changes
nothing, and a failed build never comes back by itself. A new attempt starts only when asked: the
`specdeploy.dev/retry` annotation set to a new value names a new Job (`<name>-build-<hash of the value>`);
the previous attempt's Job is deleted. An EngineBuild no deployment uses is garbage-collected after the grace
period.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from specdeploy_operator.api import API_VERSION
from specdeploy_operator.builders import build_job, job_name

from .indexes import Obj, every
from .kube import ObjectRef
from .podcreation import job_creation_problem, job_events_needed
from .status import engine_build_status, rfc3339

if TYPE_CHECKING:
    from .reconciler import Reconciler

__all__ = ["TERMINAL", "UNREFERENCED_ANNOTATION", "reconcile_engine"]

log = logging.getLogger(__name__)

TERMINAL: Final = frozenset({"Succeeded", "Failed"})
UNREFERENCED_ANNOTATION: Final = "specdeploy.dev/unreferenced-since"
"""When an EngineBuild stopped being used by any deployment (garbage collection after the grace period)."""
JOB_EVENTS_RETRY_SECONDS: Final = 5.0
"""How soon a build Job without a pod is looked at again (its events say whether pods cannot be created)."""


def is_terminal(body: Obj) -> bool:
    """Whether the EngineBuild's current attempt has finished: its status is terminal and was reached by the
    Job the EngineBuild names now (a new retry annotation names another)."""
    status = body.get("status") or {}
    return status.get("phase") in TERMINAL and status.get("jobName") in (None, job_name(body))


async def reconcile_engine(r: Reconciler, namespace: str, name: str) -> float | None:
    body = r.observe("EngineBuild", namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return None
    collect_in = await _collect_garbage(r, body)
    if collect_in is not None:
        return collect_in if collect_in > 0 else None
    if is_terminal(body):
        await _confirm_terminal(r, body)
        return None
    previous: dict[str, Any] = dict(body.get("status") or {})
    job_for_attempt = job_name(body)
    old_job = previous.get("jobName")
    if old_job and old_job != job_for_attempt:
        # A retry: the previous attempt's Job goes, its phase does not carry over to the new one.
        await r.delete(ObjectRef("batch/v1", "Job", namespace, str(old_job)))
        previous = {k: v for k, v in previous.items() if k in ("conditions", "attempts")}
        log.info("retrying build", extra={"object": f"{namespace}/{name}", "job": job_for_attempt})
    job, created = await r.create_if_absent(build_job(dict(body), r.settings))
    pods = every(r.indices.get("pods"), (namespace, "job", job_for_attempt))
    # A Job whose pod the API server refuses (PodSecurity, a quota, a LimitRange) says so only in events.
    creation, retry = None, None
    if job_events_needed(job, pods):
        retry = JOB_EVENTS_RETRY_SECONDS
        if not created:
            events = await r.kube.events_about(namespace, "Job", job_for_attempt)
            creation = job_creation_problem(job, pods, events)
    status = engine_build_status(job, pods, previous, r.clock(), creation)
    await r.write_status(body, status)
    return retry


async def _confirm_terminal(r: Reconciler, body: Obj) -> None:
    """A finished attempt's phase as its Job tells it, while the Job is there: a status someone edited by
    hand (`Failed` on a build whose Job completed, or the reverse) is written back. Once the Job is gone
    (its TTL) the status is all that is left of the attempt, and it is kept."""
    meta = body["metadata"]
    namespace, name = str(meta["namespace"]), str(meta["name"])
    job = r.observe("Job", namespace, job_name(body))
    if job is None:
        return
    previous: dict[str, Any] = dict(body.get("status") or {})
    pods = every(r.indices.get("pods"), (namespace, "job", job_name(body)))
    status = engine_build_status(job, pods, previous, r.clock())
    if status["phase"] in TERMINAL and status["phase"] != previous.get("phase"):
        log.warning(
            "status contradicted the build Job; corrected",
            extra={"object": f"{namespace}/{name}", "was": previous.get("phase"), "job": status["phase"]},
        )
        await r.write_status(body, status)


async def _collect_garbage(r: Reconciler, body: Obj) -> float | None:
    """None when the EngineBuild is in use; otherwise seconds until it may be deleted (0: deleted now).
    The moment it became unused is stored on it, so a restart does not restart the grace period."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    ref = ObjectRef(API_VERSION, "EngineBuild", namespace, name)
    since = (meta.get("annotations") or {}).get(UNREFERENCED_ANNOTATION)
    if r.users_of(namespace, name):
        if since is not None:
            await r.kube.patch(ref, {"metadata": {"annotations": {UNREFERENCED_ANNOTATION: None}}})
        return None
    now = r.clock()
    if since is None:
        await r.kube.patch(ref, {"metadata": {"annotations": {UNREFERENCED_ANNOTATION: rfc3339(now)}}})
        remaining = float(r.settings.gc_grace_seconds)
    else:
        try:
            began = datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            began = now
        remaining = r.settings.gc_grace_seconds - (now - began).total_seconds()
    if remaining > 0:
        return remaining + 0.5
    await r.kube.delete(ref, uid=meta.get("uid"))
    log.info("deleted unused EngineBuild", extra={"object": f"{namespace}/{name}"})
    return 0.0
