"""The engine-cache claim of a SpeculativeDeployment: which claim it uses, and the claims the operator creates
(the deployment's own for `spec.engineCache.size`, or the operator's shared default claim)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from specdeploy_operator.api import SpeculativeDeployment

from .common import (
    COMPONENT_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NAME_LABEL,
    child_metadata,
    derived_name,
    metadata,
    short_hash,
)
from .settings import OperatorSettings

__all__ = [
    "READ_WRITE_MANY",
    "CacheClaim",
    "build_cache_pvc",
    "build_default_cache_pvc",
    "cache_claim",
    "cache_pvc_name",
]

READ_WRITE_MANY: Final = "ReadWriteMany"
"""The access mode the engine cache needs: a build pod writes it on one node, serving pods read it on
others."""


def cache_pvc_name(sdep: SpeculativeDeployment, settings: OperatorSettings) -> str:
    """The engine-cache claim of the deployment: `spec.engineCache.pvcName`, the claim the operator creates
    for `spec.engineCache.size` (`<name>-engine-cache`, never the name of the operator's default claim, which
    other deployments share), or the operator's default claim."""
    cache = sdep.spec.engine_cache
    if cache is not None and cache.pvc_name:
        return cache.pvc_name
    if cache is not None and cache.size:
        name = sdep.metadata.name or ""
        own = derived_name(name, "engine-cache")
        if own == settings.cache_pvc_name:
            own = derived_name(name, f"{short_hash(name)}-engine-cache")
        return own
    return settings.cache_pvc_name


def build_cache_pvc(
    sdep: SpeculativeDeployment, settings: OperatorSettings | None = None
) -> dict[str, Any] | None:
    """The engine-cache claim the operator creates for `spec.engineCache.size` (None otherwise), owned by the
    deployment. An existing claim (`pvcName`) or the operator's default claim is never created here."""
    settings = settings or OperatorSettings()
    cache = sdep.spec.engine_cache
    if cache is None or not cache.size:
        return None
    claim: dict[str, Any] = {
        "accessModes": [READ_WRITE_MANY],
        "resources": {"requests": {"storage": str(cache.size)}},
    }
    storage_class = cache.storage_class_name or settings.cache_storage_class_name
    if storage_class:
        claim["storageClassName"] = storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": child_metadata(sdep, "engine-cache", cache_pvc_name(sdep, settings)),
        "spec": claim,
    }


def build_default_cache_pvc(namespace: str, settings: OperatorSettings | None = None) -> dict[str, Any]:
    """The operator's default engine-cache claim (`SPECDEPLOY_CACHE_PVC_NAME`) in `namespace`, created when a
    deployment there leaves `spec.engineCache` unset and the claim does not exist yet. Shared by every such
    deployment of the namespace, so it has no owner: deleting the namespace (or the claim) removes it."""
    settings = settings or OperatorSettings()
    claim: dict[str, Any] = {
        "accessModes": [READ_WRITE_MANY],
        "resources": {"requests": {"storage": settings.cache_size}},
    }
    if settings.cache_storage_class_name:
        claim["storageClassName"] = settings.cache_storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": metadata(
            settings.cache_pvc_name,
            namespace,
            {NAME_LABEL: "specdeploy", COMPONENT_LABEL: "engine-cache", MANAGED_BY_LABEL: MANAGED_BY},
            [],
        ),
        "spec": claim,
    }


@dataclass(frozen=True, slots=True)
class CacheClaim:
    """A claim the operator creates for a deployment: its own (`shared` False: kept as rendered), or the
    operator's default claim (`shared` True: created when missing, never changed: it may be a user's)."""

    claim: dict[str, Any]
    shared: bool


def cache_claim(sdep: SpeculativeDeployment, settings: OperatorSettings) -> CacheClaim | None:
    """The claim the operator creates for `sdep`; None when it uses a claim of its own (`pvcName`)."""
    own = build_cache_pvc(sdep, settings)
    if own is not None:
        return CacheClaim(own, shared=False)
    if cache_pvc_name(sdep, settings) == settings.cache_pvc_name:
        return CacheClaim(build_default_cache_pvc(sdep.metadata.namespace or "", settings), shared=True)
    return None
