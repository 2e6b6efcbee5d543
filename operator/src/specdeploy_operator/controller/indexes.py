"""Reading kopf's indexes: key -> the live objects kopf keeps (plain copies: nothing holds kopf's views)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["Obj", "every", "one", "resource_version"]

Obj = Mapping[str, Any]


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
