"""Condition `EngineCacheReady`: whether the engine-cache claim can serve build and serving pods on several
nodes. Pure: it reads the claim and the events about it.

Engines are written by a build Job on one node and read by serving pods on others, so the claim must be bound
with `ReadWriteMany`. A claim that never binds (the provisioner refuses: a block-storage class cannot make a
`ReadWriteMany` volume) or one bound `ReadWriteOnce` (pods on a second node wait for ever to attach it) would
otherwise show only as pods waiting; here it is said, with the provisioner's own message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from specdeploy_operator.api import (
    ClaimPhase,
    ConditionStatus,
    ConditionType,
    EventType,
    KubeReason,
    Reason,
)
from specdeploy_operator.builders import READ_WRITE_MANY

from .conditions import ConditionSpec

__all__ = ["CACHE_RETRY_SECONDS", "STORAGE_DOCS", "cache_condition"]

Obj = Mapping[str, Any]

CACHE_RETRY_SECONDS: Final = 30.0
"""How soon a deployment whose claim is not ready is looked at again (provisioning failures are events, which
the operator does not watch)."""
STORAGE_DOCS: Final = "docs/install.md#the-engine-cache"
"""Where the StorageClasses that work are listed."""

_FIX: Final = (
    "use a ReadWriteMany StorageClass (EFS, Filestore, Azure Files, FSx for Lustre, NFS, CephFS; "
    f"{STORAGE_DOCS})"
)


def _newest(events: Sequence[Obj], reason: str | None = None) -> Obj | None:
    chosen = [e for e in events if reason is None or e.get("reason") == reason]
    stamp = ("lastTimestamp", "eventTime", "firstTimestamp")
    chosen.sort(key=lambda e: next((str(e[k]) for k in stamp if e.get(k)), ""))
    return chosen[-1] if chosen else None


def _modes(claim: Obj) -> list[str]:
    status, spec = claim.get("status") or {}, claim.get("spec") or {}
    return list(status.get("accessModes") or spec.get("accessModes") or [])


def cache_condition(
    name: str, claim: Obj | None, events: Sequence[Obj], *, user_claim: bool
) -> ConditionSpec:
    """`EngineCacheReady` for the claim `name` (None: not found; `user_claim`: named by
    `spec.engineCache.pvcName`, so the operator does not create it) and the core events about it."""
    if claim is None:
        if user_claim:
            return _false(
                Reason.CLAIM_MISSING,
                f"the engine-cache claim {name} (spec.engineCache.pvcName) does not exist: create it with "
                f"accessModes [ReadWriteMany], or unset spec.engineCache.pvcName",
            )
        return _unknown(Reason.CLAIM_PENDING, f"the engine-cache claim {name} is being created")
    spec = claim.get("spec") or {}
    phase = (claim.get("status") or {}).get("phase")
    storage_class = spec.get("storageClassName") or "the cluster's default"
    modes = _modes(claim)
    where = f"(StorageClass {storage_class}, access modes {', '.join(modes) or 'none'})"
    if phase == ClaimPhase.LOST:
        return _false(Reason.CLAIM_LOST, f"the engine-cache claim {name} lost its volume {where}")
    if READ_WRITE_MANY not in modes:
        return _false(
            Reason.CLAIM_NOT_READ_WRITE_MANY,
            f"the engine-cache claim {name} {where} is not ReadWriteMany: only pods on one node can mount "
            f"it, so build and serving pods on other nodes wait for ever; {_FIX}",
        )
    if phase == ClaimPhase.BOUND:
        return ConditionSpec(
            ConditionType.ENGINE_CACHE_READY,
            ConditionStatus.TRUE,
            Reason.CLAIM_BOUND,
            f"the engine-cache claim {name} is bound {where}",
        )
    failed = _newest(events, KubeReason.PROVISIONING_FAILED)
    if failed is not None:
        source = (failed.get("source") or {}).get("component") or failed.get("reportingComponent") or ""
        by = f" ({source})" if source else ""
        return _false(
            Reason.CLAIM_PROVISIONING_FAILED,
            f"the engine-cache claim {name} {where} cannot be provisioned; the provisioner{by} says: "
            f"{str(failed.get('message') or '').strip()}; {_FIX}",
        )
    last = _newest([e for e in events if e.get("type") in (EventType.NORMAL, EventType.WARNING)])
    said = f": {str(last.get('message') or '').strip()}" if last is not None else ""
    return _unknown(Reason.CLAIM_PENDING, f"the engine-cache claim {name} {where} is not bound yet{said}")


def _false(reason: Reason, message: str) -> ConditionSpec:
    return ConditionSpec(ConditionType.ENGINE_CACHE_READY, ConditionStatus.FALSE, reason, message)


def _unknown(reason: Reason, message: str) -> ConditionSpec:
    return ConditionSpec(ConditionType.ENGINE_CACHE_READY, ConditionStatus.UNKNOWN, reason, message)
