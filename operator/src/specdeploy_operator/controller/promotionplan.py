"""Canary and promotion of a trained draft, decided from the DraftTraining, the canary's figures and the
clock. Pure; `trainings.py` applies it.

    (trained) -> Canary -> Promoted | Rejected          Promoted <-> RolledBack   (spec.promotion.rollback)

While `Canary`, one replica serving the trained draft (`builders/canary.py`) runs behind the deployment's
Service. Each sampling round in which both the canary and the deployment's own replicas took steps adds
both sides' counter deltas (`canarywindows.py`); once each side had `minDraftedTokens` verified, the canary is
promoted if its acceptance is at least `minAcceptanceGain` above the current replicas', else rejected. A
window that ends first (`windowSeconds`) rejects it for too little traffic. The canary goes with the
decision; a promoted draft is what the deployment serves until `rollback` is set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from specdeploy_operator.api import ConditionStatus, ConditionType, PromotionPhase, Reason
from specdeploy_operator.api.drafttraining import PromotionRule

from .conditions import ConditionSpec, rfc3339

__all__ = ["Figures", "PromotionPlan", "plan_promotion"]

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Figures:
    """Counter deltas of one side of the canary over the window."""

    drafted: float = 0.0
    accepted: float = 0.0
    steps: float = 0.0
    generated: float = 0.0

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted > 0 else None

    def to_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"drafted": int(self.drafted)}
        if self.acceptance is not None:
            out["acceptance"] = round(min(self.acceptance, 1.0), 3)
        if self.steps > 0:
            out["tokensPerStep"] = round(self.generated / self.steps, 3)
        return out


@dataclass(frozen=True, slots=True)
class PromotionPlan:
    """`status.promotion`, the `Promoted` condition, whether the canary should run, and when to look again."""

    status: dict[str, Any]
    condition: ConditionSpec
    canary: bool
    requeue: float | None = None


def _parse(raw: object) -> datetime | None:
    if not isinstance(raw, str):
        return None
    try:
        return datetime.strptime(raw, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def _condition(status: ConditionStatus, reason: Reason, message: str) -> ConditionSpec:
    return ConditionSpec(ConditionType.PROMOTED, status, reason, message)


def plan_promotion(
    rule: PromotionRule,
    previous: Obj | None,
    figures: tuple[Figures, Figures] | None,
    now: datetime,
    refused: str | None = None,
) -> PromotionPlan:
    """The promotion of a trained draft under `rule`; `previous`: its `status.promotion` so far; `figures`:
    (canary, current) over the window so far (None: none sampled yet); `refused`: why the deployment cannot
    serve the draft at all."""
    previous = previous or {}
    phase = previous.get("phase")
    decided = {k: v for k, v in previous.items() if k != "message"}
    status: dict[str, Any]
    if phase in (PromotionPhase.PROMOTED, PromotionPhase.ROLLED_BACK):
        if rule.rollback:
            message = "rolled back (spec.promotion.rollback): the deployment serves its own draft"
            status = {**decided, "phase": str(PromotionPhase.ROLLED_BACK), "message": message}
            return PromotionPlan(
                status, _condition(ConditionStatus.FALSE, Reason.DRAFT_ROLLED_BACK, message), False
            )
        message = str(previous.get("message") or "")
        if phase == PromotionPhase.ROLLED_BACK:
            message = (
                "promoted again (spec.promotion.rollback unset): the deployment serves the trained draft"
            )
        status = {**decided, "phase": str(PromotionPhase.PROMOTED), "message": message}
        return PromotionPlan(status, _condition(ConditionStatus.TRUE, Reason.DRAFT_PROMOTED, message), False)
    if phase == PromotionPhase.REJECTED:
        message = str(previous.get("message") or "rejected")
        return PromotionPlan(
            dict(previous), _condition(ConditionStatus.FALSE, Reason.DRAFT_REJECTED, message), False
        )
    if refused is not None:
        status = {"phase": str(PromotionPhase.REJECTED), "decisionTime": rfc3339(now), "message": refused}
        return PromotionPlan(status, _condition(ConditionStatus.FALSE, Reason.CANARY_REFUSED, refused), False)
    if rule.rollback:
        message = "not started: spec.promotion.rollback is set"
        status = {"phase": str(PromotionPhase.REJECTED), "decisionTime": rfc3339(now), "message": message}
        return PromotionPlan(status, _condition(ConditionStatus.FALSE, Reason.DRAFT_REJECTED, message), False)
    started = _parse(previous.get("startTime")) or now
    status = {"phase": str(PromotionPhase.CANARY), "startTime": rfc3339(started)}
    canary, current = figures or (Figures(), Figures())
    status["canary"], status["current"] = canary.to_status(), current.to_status()
    need = rule.min_drafted_tokens
    if canary.drafted >= need and current.drafted >= need:
        gain = (canary.acceptance or 0.0) - (current.acceptance or 0.0)
        status["decisionTime"] = rfc3339(now)
        verdict = (
            f"canary acceptance {canary.acceptance:.3f} against {current.acceptance:.3f} ({gain:+.3f}; "
            f"the rule asks +{rule.min_acceptance_gain:.3f}) over {int(canary.drafted)} and "
            f"{int(current.drafted)} drafted tokens"
        )
        if gain >= rule.min_acceptance_gain:
            status.update(phase=str(PromotionPhase.PROMOTED), message=f"promoted: {verdict}")
            return PromotionPlan(
                status, _condition(ConditionStatus.TRUE, Reason.DRAFT_PROMOTED, status["message"]), False
            )
        status.update(phase=str(PromotionPhase.REJECTED), message=f"rejected, the old draft stays: {verdict}")
        return PromotionPlan(
            status, _condition(ConditionStatus.FALSE, Reason.DRAFT_REJECTED, status["message"]), False
        )
    left = rule.window_seconds - (now - started).total_seconds()
    if left <= 0:
        message = (
            f"rejected, the old draft stays: after {rule.window_seconds} s the canary had "
            f"{int(canary.drafted)} and the current replicas {int(current.drafted)} drafted tokens verified, "
            f"of {need} each"
        )
        status.update(phase=str(PromotionPhase.REJECTED), decisionTime=rfc3339(now), message=message)
        return PromotionPlan(status, _condition(ConditionStatus.FALSE, Reason.DRAFT_REJECTED, message), False)
    message = (
        f"canary serving: {int(canary.drafted)} and {int(current.drafted)} of {need} drafted tokens "
        f"verified, {int(left)} s of the window left"
    )
    status["message"] = message
    return PromotionPlan(
        status, _condition(ConditionStatus.UNKNOWN, Reason.CANARY_SERVING, message), True, left + 1
    )
