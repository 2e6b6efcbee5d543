"""Kubernetes value types used inside specdeploy objects: object names, label keys and values, quantities and
percentages, each with the pattern the apiserver checks."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import PlainValidator, StringConstraints, WithJsonSchema
from pydantic_core import PydanticCustomError

__all__ = [
    "DNS_1035_LABEL",
    "DNS_1123_LABEL",
    "DNS_1123_SUBDOMAIN",
    "QUALIFIED_NAME",
    "DnsSubdomain",
    "LabelValue",
    "PercentOrCount",
    "QualifiedName",
    "Quantity",
    "SelectorValue",
]

DNS_1123_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
DNS_1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
QUALIFIED_NAME = (
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
)
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"

DnsSubdomain = Annotated[str, StringConstraints(pattern=DNS_1123_SUBDOMAIN, min_length=1, max_length=253)]
"""A Kubernetes object name (Secret, ConfigMap, PVC, PriorityClass, StorageClass)."""
QualifiedName = Annotated[str, StringConstraints(pattern=QUALIFIED_NAME, min_length=1, max_length=316)]
"""A label key or extended resource name, such as `nvidia.com/gpu.product`."""
LabelValue = Annotated[str, StringConstraints(pattern=_LABEL_VALUE, min_length=1, max_length=63)]
"""A non-empty label value, such as `NVIDIA-H100-80GB-HBM3`."""
SelectorValue = Annotated[str, StringConstraints(pattern=_LABEL_VALUE, max_length=63)]
"""A label value in a node selector (it may be empty)."""

# --- int-or-string ------------------------------------------------------------------------------------------

_QUANTITY_STRING = r"^(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[mkMGTPE]|([eE][+-]?[0-9]+))?$"
_PERCENT_STRING = r"^(100|[1-9]?[0-9])%$"


def _int_or_string(
    value: object, *, pattern: str, what: str, error_type: str, max_int: int | None = None
) -> int | str:
    # bool is an int in Python but never a valid quantity; the apiserver rejects it too.
    if isinstance(value, int) and not isinstance(value, bool):
        if value >= 0 and (max_int is None or value <= max_int):
            return value
    elif isinstance(value, str) and len(value) <= 64 and re.fullmatch(pattern, value):
        return value
    raise PydanticCustomError(error_type, "must be {what}", {"what": what})


def _quantity(value: object) -> int | str:
    return _int_or_string(
        value,
        pattern=_QUANTITY_STRING,
        what="a non-negative quantity: an integer or a string such as '500m', '16Gi' or '1.5'",
        error_type="quantity",
    )


def _percent_or_count(value: object) -> int | str:
    return _int_or_string(
        value,
        pattern=_PERCENT_STRING,
        what="a non-negative integer or a percentage between '0%' and '100%'",
        error_type="percent_or_count",
    )


Quantity = Annotated[
    int | str,
    PlainValidator(_quantity),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": _QUANTITY_STRING,
            "minimum": 0,
            "maxLength": 64,
        }
    ),
]
"""A Kubernetes resource quantity (`4`, `500m`, `16Gi`)."""

PercentOrCount = Annotated[
    int | str,
    PlainValidator(_percent_or_count),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": _PERCENT_STRING,
            "minimum": 0,
            "maxLength": 4,
        }
    ),
]
"""A replica count or a percentage of replicas (`1`, `25%`)."""
