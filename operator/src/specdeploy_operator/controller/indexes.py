"""Reading kopf's indexes: key -> the live objects kopf keeps (plain copies: nothing holds kopf's views)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = ["INDEX_IDS", "INDEX_OF_KIND", "Obj", "every", "one", "owner_names", "resource_version"]

Obj = Mapping[str, Any]

INDEX_IDS: Final = (
    "sdeps",
    "engine_users",
    "enginebuilds",
    "drafttrainings",
    "jobs",
    "pods",
    "deployments",
    "leaderworkersets",
    "configmaps",
    "services",
    "pdbs",
    "pvcs",
    "hpas",
)
"""The kopf indexes the reconciler reads (registered in `handlers`)."""

INDEX_OF_KIND: Final = {
    "SpeculativeDeployment": "sdeps",
    "EngineBuild": "enginebuilds",
    "DraftTraining": "drafttrainings",
    "Job": "jobs",
    "Deployment": "deployments",
    "LeaderWorkerSet": "leaderworkersets",
    "ConfigMap": "configmaps",
    "Service": "services",
    "PodDisruptionBudget": "pdbs",
    "PersistentVolumeClaim": "pvcs",
    "HorizontalPodAutoscaler": "hpas",
}
"""The index of each kind the reconciler observes (ScaledObjects have none: KEDA may not be installed)."""


def one(index: Any, key: object) -> Obj | None:
    """The object an index holds under `key`, or None."""
    if index is None or key not in index:
        return None
    for value in index[key]:
        return dict(value)
    return None


def every(index: Any, key: object) -> list[Obj]:
    """Every object an index holds under `key`."""
    if index is None or key not in index:
        return []
    return [dict(value) for value in index[key]]


def resource_version(obj: Obj | None) -> str | None:
    return ((obj or {}).get("metadata") or {}).get("resourceVersion")


def owner_names(body: Obj, kind: str) -> Iterable[str]:
    """Names of the owners of `body` of kind `kind`."""
    for owner in (body.get("metadata") or {}).get("ownerReferences") or ():
        if owner.get("kind") == kind:
            yield str(owner["name"])
