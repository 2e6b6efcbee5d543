"""What is live versus what the operator wants: pure comparisons, no API calls.

The reconciler decides whether to apply an object by comparing the object it renders with the live one, never
with a record of what it sent last: a field another actor changed (a `kubectl edit` of the ConfigMap's data,
a scaled Deployment, a Service's port) differs from the rendering, so it is applied again, while the steady
state (live object = rendering, plus what the API server and other controllers added) costs no request.

`contains(live, desired)` is that comparison. The API server adds defaults (`protocol: TCP`, probe periods,
`clusterIP`, `deployment.kubernetes.io/revision`, ...) and rewrites resource quantities into canonical form
(`0.5` becomes `500m`), so "equal" would never hold; "every field the operator sets has the value it sets"
does, and is exactly the set of fields the operator owns by server-side apply (field manager `specdeploy`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from specdeploy_operator.builders.common import quantity_value

__all__ = ["contains", "difference", "first_difference", "merge_patch"]

QUANTITY_PARENTS: Final = frozenset({"limits", "requests", "capacity"})
"""Mappings whose values are resource quantities (compared by value: `1Gi` equals `1024Mi`)."""
QUANTITY_KEYS: Final = frozenset({"sizeLimit", "averageValue", "value", "storage"})
METADATA_FIELDS: Final = ("labels", "annotations", "ownerReferences")
"""The metadata the operator renders; the rest (uid, resourceVersion, managedFields, ...) is the server's."""


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, dict | list) and not value)


def _same_scalar(live: Any, desired: Any, quantity: bool) -> bool:
    if live == desired and type(live) is type(desired):
        return True
    if quantity and isinstance(live, int | str) and isinstance(desired, int | str):
        try:
            return quantity_value(live) == quantity_value(desired)
        except ValueError:
            return False
    return False


def first_difference(live: Any, desired: Any, path: str = "", quantity: bool = False) -> str | None:
    """The path of the first field `desired` sets that `live` does not have with the same value; None when
    `live` holds all of `desired`. An empty mapping or list (or None) in `desired` matches an absent field."""
    if isinstance(desired, Mapping):
        if not isinstance(live, Mapping):
            return None if _empty(desired) and live is None else path or "."
        for key, value in desired.items():
            child = f"{path}.{key}" if path else str(key)
            if key not in live:
                if _empty(value):
                    continue
                return child
            in_quantities = key in QUANTITY_KEYS or path.rsplit(".", 1)[-1] in QUANTITY_PARENTS
            found = first_difference(live[key], value, child, quantity=in_quantities)
            if found is not None:
                return found
        return None
    if isinstance(desired, Sequence) and not isinstance(desired, str):
        if not isinstance(live, Sequence) or isinstance(live, str) or len(live) != len(desired):
            return None if _empty(desired) and _empty(live) else path
        for i, (live_item, desired_item) in enumerate(zip(live, desired, strict=True)):
            found = first_difference(live_item, desired_item, f"{path}[{i}]", quantity)
            if found is not None:
                return found
        return None
    return None if _same_scalar(live, desired, quantity) else path


def contains(live: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether the live object holds every field of `desired` (its rendered metadata included) with the value
    `desired` gives it."""
    if live is None:
        return False
    return difference(live, desired) is None


def difference(live: Mapping[str, Any], desired: Mapping[str, Any]) -> str | None:
    """The first field of `desired` the live object lacks or holds another value in (for logs)."""
    meta = desired.get("metadata") or {}
    live_meta = live.get("metadata") or {}
    for field in METADATA_FIELDS:
        if field in meta:
            found = first_difference(live_meta.get(field), meta[field], f"metadata.{field}")
            if found is not None:
                return found
    body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata", "status")}
    live_body = {k: v for k, v in live.items() if k in body}
    return first_difference(live_body, body)


def merge_patch(old: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, Any]:
    """A JSON merge patch turning `old` into `new` where both are objects: `new` itself, with `None` for every
    key of `old` missing from `new`, recursively into objects present in both (a nested field that went away,
    say `status.autoscaler.message`, is removed, not kept by the merge)."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            patch[key] = merge_patch(before, value)
        else:
            patch[key] = value
    return patch
