"""Names, labels and references shared by the builders. Pure functions."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from decimal import Decimal
from typing import Any, Final

from specdeploy_operator.api import API_VERSION, SpeculativeDeployment

__all__ = [
    "COMPONENT_LABEL",
    "ENGINE_HASHES_ANNOTATION",
    "FIELD_MANAGER",
    "MANAGED_BY",
    "SERVER_COMPONENT",
    "child_metadata",
    "configmap_name",
    "deployment_name",
    "derived_name",
    "dns_label",
    "endpoint",
    "group_pod_selector",
    "labels",
    "owner_reference",
    "pod_selector",
    "quantity_value",
    "selector_labels",
    "selector_string",
    "status_selector",
]

FIELD_MANAGER: Final = "specdeploy"
MANAGED_BY: Final = "specdeploy"
NAME_LABEL: Final = "app.kubernetes.io/name"
INSTANCE_LABEL: Final = "app.kubernetes.io/instance"
COMPONENT_LABEL: Final = "app.kubernetes.io/component"
MANAGED_BY_LABEL: Final = "app.kubernetes.io/managed-by"
ENGINE_HASHES_ANNOTATION: Final = "specdeploy.dev/engine-hashes"
ENGINE_HASH_LABEL: Final = "specdeploy.dev/engine-hash"
ENGINE_ROLE_LABEL: Final = "specdeploy.dev/engine-role"
MAX_NAME: Final = 63
SERVER_COMPONENT: Final = "server"
"""`app.kubernetes.io/component` of the serving objects (Deployment, pods, Service, PDB, ConfigMap)."""

_INVALID = re.compile(r"[^a-z0-9-]+")


def dns_label(*parts: str, max_length: int = MAX_NAME) -> str:
    """A DNS-1123 label from `parts` joined by `-`. The last part is kept whole (it carries the hash or the
    suffix that makes the name unique); the first parts are lower-cased, cleaned and shortened to fit."""
    if not parts:
        raise ValueError("no parts")
    *head, last = parts
    cleaned = [_INVALID.sub("-", part.lower()).strip("-") for part in head]
    prefix = "-".join(part for part in cleaned if part)
    room = max_length - len(last) - 1
    name = last[:max_length] if room <= 0 or not prefix else f"{prefix[:room].rstrip('-')}-{last}"
    return name.strip("-")


def derived_name(name: str, suffix: str) -> str:
    """The name of a child that is one per deployment: `<name>-<suffix>` when that fits a DNS-1123 label;
    else the name shortened, with a hash of the whole name before the suffix, so that two long names sharing
    their first characters never share a child."""
    whole = f"{name}-{suffix}"
    if len(whole) <= MAX_NAME:
        return whole
    return dns_label(name, f"{short_hash(name)}-{suffix}")


def short_hash(*values: str, length: int = 8) -> str:
    """A short SHA-256 hex digest of `values`, for names that must stay under the length limit."""
    digest = hashlib.sha256("\x00".join(values).encode()).hexdigest()
    return digest[:length]


def selector_labels(name: str, component: str) -> dict[str, str]:
    """Labels that select the children of one deployment with one role."""
    return {NAME_LABEL: "specdeploy", INSTANCE_LABEL: name, COMPONENT_LABEL: component}


def labels(name: str, component: str) -> dict[str, str]:
    """The standard labels of a child object."""
    return {**selector_labels(name, component), MANAGED_BY_LABEL: MANAGED_BY}


def selector_string(match_labels: Mapping[str, str]) -> str:
    """`status.selector` form of a label selector (`k=v,k=v`, sorted), as the scale subresource wants."""
    return ",".join(f"{key}={match_labels[key]}" for key in sorted(match_labels))


def owner_reference(obj: Mapping[str, Any], *, controller: bool = True) -> dict[str, Any]:
    """An ownerReference to `obj` (a dict with apiVersion, kind, metadata.name and metadata.uid). Objects
    rendered offline have no uid yet: the placeholder `""` is kept and the handler fills it in."""
    metadata = obj.get("metadata") or {}
    return {
        "apiVersion": obj.get("apiVersion", API_VERSION),
        "kind": obj["kind"],
        "name": metadata["name"],
        "uid": metadata.get("uid", ""),
        "controller": controller,
        "blockOwnerDeletion": True,
    }


def deployment_owner(sdep: SpeculativeDeployment) -> dict[str, Any]:
    """The ownerReference every serving child carries."""
    return owner_reference(
        {
            "apiVersion": sdep.api_version,
            "kind": sdep.kind,
            "metadata": sdep.metadata.model_dump(by_alias=True, exclude_none=True),
        }
    )


def deployment_name(sdep: SpeculativeDeployment) -> str:
    """The deployment's name, which its serving Deployment, Service, PDB and autoscaler carry too."""
    name = sdep.metadata.name
    if not name:
        raise ValueError("metadata.name is required")
    return name


def configmap_name(sdep: SpeculativeDeployment) -> str:
    return derived_name(deployment_name(sdep), "server-config")


def pod_selector(sdep: SpeculativeDeployment) -> dict[str, str]:
    """matchLabels of the serving pods."""
    return selector_labels(deployment_name(sdep), SERVER_COMPONENT)


def group_pod_selector(sdep: SpeculativeDeployment) -> dict[str, str]:
    """matchLabels of every pod of a deployment's groups, leaders (component `server`) and workers."""
    selector = selector_labels(deployment_name(sdep), SERVER_COMPONENT)
    del selector[COMPONENT_LABEL]
    return selector


def status_selector(sdep: SpeculativeDeployment) -> str:
    """`status.selector` of the deployment (scale subresource)."""
    return selector_string(pod_selector(sdep))


def endpoint(sdep: SpeculativeDeployment) -> str:
    """The OpenAI-compatible base URL written to `status.endpoint`."""
    namespace = sdep.metadata.namespace or "default"
    return f"http://{deployment_name(sdep)}.{namespace}.svc:{sdep.spec.serving.port}/v1"


def child_metadata(sdep: SpeculativeDeployment, component: str, name: str | None = None) -> dict[str, Any]:
    """Metadata of a child of `sdep` (named like the deployment unless `name` says otherwise): its namespace,
    the standard labels of `component`, and the deployment as owner."""
    owner = deployment_name(sdep)
    owners = [deployment_owner(sdep)]
    return metadata(name or owner, sdep.metadata.namespace, labels(owner, component), owners)


def metadata(
    name: str, namespace: str | None, object_labels: Mapping[str, str], owners: list[dict[str, Any]]
) -> dict[str, Any]:
    """Object metadata with deterministic key order."""
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    meta["labels"] = dict(object_labels)
    if owners:
        meta["ownerReferences"] = owners
    return meta


_QUANTITY = re.compile(
    r"^(?P<number>[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+))(?:(?P<exponent>[eE][-+]?[0-9]+)|(?P<suffix>[a-zA-Z]*))$"
)
_QUANTITY_SUFFIXES: Final = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    **{suffix: Decimal(1024**power) for power, suffix in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), 1)},
}


def quantity_value(quantity: int | str) -> Decimal:
    """The number a Kubernetes quantity stands for (`500m` -> 0.5, `2Gi` -> 2147483648, `1e3` -> 1000)."""
    if isinstance(quantity, int):
        return Decimal(quantity)
    match = _QUANTITY.fullmatch(quantity)
    if match is None or (match["exponent"] is None and match["suffix"] not in _QUANTITY_SUFFIXES):
        raise ValueError(f"not a quantity: {quantity!r}")
    if match["exponent"] is not None:
        return Decimal(match["number"] + match["exponent"])
    return Decimal(match["number"]) * _QUANTITY_SUFFIXES[match["suffix"]]
