"""The events the operator posts, decided from what a status write changed. Pure: the reconcile posts what
these return, through the cluster port.

Milestones are posted when the phase changes, or when a Degraded deployment is degraded for another reason
(e.g. Unschedulable -> CapacityPending); a status that newly says pods cannot be created gets a Warning of its
own (podcreation.py), as does speculation that stops paying and each distinct refused write."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from specdeploy_operator.api import (
    BuildPhase,
    ConditionStatus,
    ConditionType,
    DeploymentPhase,
    EventType,
    Reason,
    RunPhase,
)

from .conditions import MAX_MESSAGE, find_condition
from .podcreation import creation_event

__all__ = ["Event", "acceptance_event", "status_events", "sync_event"]

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Event:
    """One event about the reconciled object."""

    type: EventType
    reason: str
    message: str


def _build_milestone(new: object, status: Obj) -> Event | None:
    message = str(status.get("message") or "")
    if new == BuildPhase.RUNNING:
        return Event(EventType.NORMAL, Reason.BUILD_STARTED, f"build Job {status.get('jobName')} is running")
    if new == BuildPhase.SUCCEEDED:
        return Event(EventType.NORMAL, Reason.BUILD_SUCCEEDED, message)
    if new == BuildPhase.FAILED:
        return Event(EventType.WARNING, Reason.BUILD_FAILED, message)
    return None


def _training_milestone(new: object, status: Obj) -> Event | None:
    """A DraftTraining's step started, succeeded or failed: the condition that says so, as an event."""
    if new == RunPhase.GENERATING:
        return Event(EventType.NORMAL, Reason.GENERATING, f"generate Job {status.get('generateJob')} started")
    if new == RunPhase.TRAINING:
        generated = find_condition(status, ConditionType.GENERATED)
        return Event(EventType.NORMAL, Reason.SAMPLES_GENERATED, str(generated.get("message", "")))
    if new in (RunPhase.SUCCEEDED, RunPhase.FAILED):
        trained = find_condition(status, ConditionType.TRAINED)
        kind = EventType.NORMAL if new == RunPhase.SUCCEEDED else EventType.WARNING
        return Event(kind, str(trained.get("reason")), str(trained.get("message", "")))
    return None


def promotion_event(previous: Obj, status: Obj) -> Event | None:
    """A DraftTraining's canary started, or its draft was promoted, rejected or rolled back: the `Promoted`
    condition's reason and message (a Warning for a rejection)."""
    before = (previous.get("promotion") or {}).get("phase")
    now = (status.get("promotion") or {}).get("phase")
    if now is None or now == before:
        return None
    promoted = find_condition(status, ConditionType.PROMOTED)
    reason = str(promoted.get("reason") or "")
    kind = EventType.WARNING if reason in (Reason.DRAFT_REJECTED, Reason.CANARY_REFUSED) else EventType.NORMAL
    return Event(kind, reason, str(promoted.get("message", "")))


def _deployment_milestone(new: object, status: Obj) -> Event | None:
    def message(type_: ConditionType) -> str:
        return str(find_condition(status, type_).get("message", ""))

    if new == DeploymentPhase.BUILDING:
        return Event(EventType.NORMAL, Reason.BUILDING, message(ConditionType.ENGINES_READY))
    if new == DeploymentPhase.DEPLOYING:
        return Event(EventType.NORMAL, Reason.DEPLOYING, message(ConditionType.PROGRESSING))
    if new == DeploymentPhase.READY:
        return Event(EventType.NORMAL, Reason.ROLLOUT_FINISHED, f"ready at {status.get('endpoint')}")
    if new == DeploymentPhase.FAILED:
        return Event(EventType.WARNING, Reason.BUILD_FAILED, message(ConditionType.ENGINES_READY))
    if new == DeploymentPhase.DEGRADED:
        degraded = find_condition(status, ConditionType.DEGRADED)
        return Event(
            EventType.WARNING, str(degraded.get("reason", Reason.DEGRADED)), message(ConditionType.DEGRADED)
        )
    return None


def status_events(kind: str, previous: Obj, status: Obj, *, quiet: Collection[str] = ()) -> list[Event]:
    """The events of a status write that replaced `previous` with `status` on an object of `kind`: pods that
    newly cannot be created, then the milestone of a phase change. A change to a phase in `quiet` posts no
    milestone (the reconcile posted an event that says more)."""
    events: list[Event] = []
    refused = creation_event(previous, status)
    if refused is not None:
        events.append(Event(EventType.WARNING, *refused))
    old, new = previous.get("phase"), status.get("phase")
    if new in quiet:
        return events
    if kind == "DraftTraining" and (promotion := promotion_event(previous, status)) is not None:
        events.append(promotion)
    old_reason = find_condition(previous, ConditionType.DEGRADED).get("reason")
    new_reason = find_condition(status, ConditionType.DEGRADED).get("reason")
    if old == new and (new != DeploymentPhase.DEGRADED or old_reason == new_reason):
        return events
    if kind == "DraftTraining":
        milestone = _training_milestone(new, status)
    elif kind == "EngineBuild":
        milestone = _build_milestone(new, status)
    else:
        milestone = _deployment_milestone(new, status)
    if milestone is not None:
        events.append(milestone)
    return events


def _turned_false(previous: Obj, status: Obj, type_: ConditionType) -> Event | None:
    """A Warning with the condition's reason and message when `type_` turns False (or, False already, changes
    its reason)."""
    now = find_condition(status, type_)
    before = find_condition(previous, type_)
    if now.get("status") == ConditionStatus.FALSE and (
        before.get("status") != ConditionStatus.FALSE or before.get("reason") != now.get("reason")
    ):
        return Event(EventType.WARNING, str(now["reason"]), str(now["message"]))
    return None


def acceptance_event(previous: Obj, status: Obj) -> Event | None:
    """A Warning when speculation stops paying (condition `SpeculationEffective` turns False)."""
    return _turned_false(previous, status, ConditionType.SPECULATION_EFFECTIVE)


def cache_event(previous: Obj, status: Obj) -> Event | None:
    """A Warning when the engine-cache claim cannot serve the pods (condition `EngineCacheReady` turns
    False): a provisioning failure, a claim that is not ReadWriteMany, missing or lost."""
    return _turned_false(previous, status, ConditionType.ENGINE_CACHE_READY)


def sync_event(previous: Obj, error: str | None, reason: Reason) -> Event | None:
    """A Warning for a write the API server refused, when the `Synced` condition does not already say so: one
    event per distinct refusal, not one per retry."""
    old = find_condition(previous, ConditionType.SYNCED)
    if error is not None and old.get("message") != error[:MAX_MESSAGE]:
        return Event(EventType.WARNING, reason, error)
    return None
