"""What reconciling one EngineBuild should do: an explicit lifecycle, decided from the EngineBuild and its
Job. Pure functions; `enginebuilds.py` observes, asks here, and applies through the cluster port.

    Pending -> Running -> Succeeded | Failed          (one attempt = one Job, named by `job_name`)

`Succeeded` and `Failed` are terminal for the attempt that reached them (`status.jobName`): nothing is
inferred from the Job's absence afterwards, so a finished Job that its TTL (or a person) deleted changes
nothing, and a failed build never comes back by itself. A new attempt starts only when asked: the
`specdeploy.dev/retry` annotation set to a new value names a new Job (`<name>-build-<hash of the value>`);
the previous attempt's Job is deleted. An EngineBuild no deployment uses is garbage-collected after the grace
period.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

from specdeploy_operator.api import BuildPhase
from specdeploy_operator.builders import OperatorSettings, build_job, engine_build, job_name

from .conditions import rfc3339
from .kube import ObjectRef

__all__ = [
    "JOB_EVENTS_RETRY_SECONDS",
    "TERMINAL",
    "UNREFERENCED_ANNOTATION",
    "Attempt",
    "Collection",
    "is_terminal",
    "plan_attempt",
    "plan_collection",
]

Obj = Mapping[str, Any]

TERMINAL: Final = frozenset({BuildPhase.SUCCEEDED, BuildPhase.FAILED})
UNREFERENCED_ANNOTATION: Final = "specdeploy.dev/unreferenced-since"
"""When an EngineBuild stopped being used by any deployment (garbage collection after the grace period)."""
JOB_EVENTS_RETRY_SECONDS: Final = 5.0
"""How soon a build Job without a pod is looked at again (its events say whether pods cannot be created)."""


def is_terminal(body: Obj) -> bool:
    """Whether the EngineBuild's current attempt has finished: its status is terminal and was reached by the
    Job the EngineBuild names now (a new retry annotation names another)."""
    status = body.get("status") or {}
    return status.get("phase") in TERMINAL and status.get("jobName") in (None, job_name(body))


@dataclass(frozen=True, slots=True)
class Collection:
    """Garbage collection of an EngineBuild: the annotation patch that records when it became unused (or that
    it is used again), and then: keep reconciling it (`in_use`), delete it now, or look again after `wait`
    seconds."""

    mark: dict[str, Any] | None
    in_use: bool
    delete: bool = False
    wait: float | None = None


def plan_collection(body: Obj, in_use: bool, now: datetime, grace_seconds: float) -> Collection:
    """The moment an EngineBuild became unused is stored on it, so a restart does not restart the grace
    period."""
    since = ((body.get("metadata") or {}).get("annotations") or {}).get(UNREFERENCED_ANNOTATION)
    if in_use:
        forget = {"metadata": {"annotations": {UNREFERENCED_ANNOTATION: None}}}
        return Collection(forget if since is not None else None, in_use=True)
    mark = None
    if since is None:
        mark = {"metadata": {"annotations": {UNREFERENCED_ANNOTATION: rfc3339(now)}}}
        remaining = float(grace_seconds)
    else:
        try:
            began = datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
        except ValueError:
            began = now
        remaining = grace_seconds - (now - began).total_seconds()
    if remaining > 0:
        return Collection(mark, in_use=False, wait=remaining + 0.5)
    return Collection(mark, in_use=False, delete=True)


@dataclass(frozen=True, slots=True)
class Attempt:
    """The build attempt the EngineBuild names now: its Job (`job`, wire form), the previous attempt's Job to
    delete (a retry), and the status the new one starts from."""

    job_name: str
    job: dict[str, Any]
    old_job: ObjectRef | None
    previous: dict[str, Any]


def plan_attempt(body: Obj, settings: OperatorSettings) -> Attempt:
    """The current attempt of the live EngineBuild `body`."""
    meta = body["metadata"]
    engine = engine_build(body)
    name = job_name(engine)
    previous: dict[str, Any] = dict(body.get("status") or {})
    old = previous.get("jobName")
    old_job = None
    if old and old != name:
        # A retry: the previous attempt's Job goes, its phase does not carry over to the new one.
        old_job = ObjectRef("batch/v1", "Job", str(meta["namespace"]), str(old))
        previous = {k: v for k, v in previous.items() if k in ("conditions", "attempts")}
    return Attempt(name, build_job(engine, settings), old_job, previous)
