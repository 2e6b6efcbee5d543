"""Conditions as the controller computes them, and their merge into an object's previous ones. Their types,
statuses and reasons are the API's vocabulary (`specdeploy_operator.api.conditions`). Pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from specdeploy_operator.api import ConditionStatus, ConditionType, Reason

__all__ = ["MAX_MESSAGE", "ConditionSpec", "find_condition", "merge_conditions", "rfc3339"]

Obj = Mapping[str, Any]

MAX_MESSAGE: Final = 4096
"""Longest condition message written (longer ones are cut)."""


def rfc3339(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class ConditionSpec:
    """A condition as computed now (the transition time is decided by `merge_conditions`)."""

    type: ConditionType
    status: ConditionStatus
    reason: Reason
    message: str


def merge_conditions(
    previous: Sequence[Obj] | None, current: Sequence[ConditionSpec], now: datetime, generation: int | None
) -> list[dict[str, Any]]:
    """Conditions in `current`'s order, in wire form; a condition whose status did not change keeps its
    transition time."""
    old = {str(c.get("type")): c for c in previous or ()}
    merged: list[dict[str, Any]] = []
    for cond in current:
        status = str(cond.status)
        before = old.get(cond.type)
        since = (
            before["lastTransitionTime"]
            if before is not None and before.get("status") == status and before.get("lastTransitionTime")
            else rfc3339(now)
        )
        entry: dict[str, Any] = {"type": str(cond.type), "status": status}
        if generation is not None:
            entry["observedGeneration"] = generation
        entry.update(
            {"lastTransitionTime": since, "reason": str(cond.reason), "message": cond.message[:MAX_MESSAGE]}
        )
        merged.append(entry)
    return merged


def find_condition(status: Obj | None, type_: str) -> Obj:
    """The condition of type `type_` in a status (`{}` when there is none)."""
    for cond in (status or {}).get("conditions") or ():
        if cond.get("type") == type_:
            return dict(cond)
    return {}
