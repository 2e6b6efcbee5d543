"""Turn a pydantic model's JSON Schema into a Kubernetes structural schema (apiextensions.k8s.io/v1).

What changes on the way:
- every `$ref` is inlined (structural schemas have no references) and `$defs`/`title` are dropped;
- `X | None` becomes `X`: an unset field is simply absent, and the apiserver prunes explicit nulls of
  non-nullable fields (so `crossKvCacheFraction: null`, as in seed 000's runtime.json, is accepted);
- JSON Schema 2020-12 numeric `exclusiveMinimum: 0` becomes OpenAPI v3's `minimum: 0, exclusiveMinimum: true`;
- `additionalProperties: false` is dropped (structural schemas are closed by default), while a schema-valued
  `additionalProperties` (a map) is kept and converted;
- int-or-string types already carry `x-kubernetes-int-or-string` and pass through;
- descriptions are normalised (docstring line breaks folded, paragraphs kept);
- keys are sorted, so the output is deterministic.

Anything the converter does not understand raises `SchemaError` rather than producing a schema the apiserver
might interpret differently.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

__all__ = ["SchemaError", "normalise_description", "structural_schema"]

_ALLOWED_KEYS = frozenset(
    {
        "type",
        "description",
        "properties",
        "required",
        "items",
        "additionalProperties",
        "enum",
        "default",
        "format",
        "pattern",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "minLength",
        "maxLength",
        "minItems",
        "maxItems",
        "minProperties",
        "maxProperties",
        "anyOf",
        "x-kubernetes-validations",
        "x-kubernetes-int-or-string",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
        "x-kubernetes-map-type",
        "x-kubernetes-preserve-unknown-fields",
    }
)


class SchemaError(ValueError):
    """The pydantic schema uses a construct with no faithful structural-schema equivalent."""


def normalise_description(text: str) -> str:
    """Fold docstring line breaks into spaces; keep blank-line paragraph breaks."""
    paragraphs = re.split(r"\n\s*\n", text.strip())
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in paragraphs)


def _resolve(ref: str, defs: dict[str, Any]) -> dict[str, Any]:
    prefix = "#/$defs/"
    if not ref.startswith(prefix) or ref[len(prefix) :] not in defs:
        raise SchemaError(f"unresolvable $ref {ref}")
    resolved: dict[str, Any] = defs[ref[len(prefix) :]]
    return resolved


def _convert(
    node: dict[str, Any], defs: dict[str, Any], where: str, *, partial: bool = False
) -> dict[str, Any]:
    """Convert one schema node; `partial` for the keywords next to a `$ref` or `anyOf`, which need no type."""
    node = dict(node)
    if "$ref" in node:
        target = _convert(_resolve(node.pop("$ref"), defs), defs, where)
        # Keys next to the reference (the field's description and default) win over the referenced type's.
        siblings = _convert(node, defs, where, partial=True)
        return {**target, **siblings}

    if "anyOf" in node and not node.get("x-kubernetes-int-or-string"):
        branches = [branch for branch in node.pop("anyOf") if branch != {"type": "null"}]
        if len(branches) != 1:
            raise SchemaError(f"{where}: unions other than `X | None` are not supported: {branches}")
        branch = _convert(branches[0], defs, where)
        rest = _convert(node, defs, where, partial=True)
        return {**branch, **rest}

    node.pop("title", None)
    if node.get("default", 0) is None:
        del node["default"]
    if node.get("additionalProperties") is False:
        del node["additionalProperties"]
    if "const" in node:
        node["enum"] = [node.pop("const")]

    for bound in ("exclusiveMinimum", "exclusiveMaximum"):
        value = node.get(bound)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            node[bound] = True
            node["minimum" if bound == "exclusiveMinimum" else "maximum"] = value

    if "description" in node:
        node["description"] = normalise_description(node["description"])
    if "properties" in node:
        node["properties"] = {
            name: _convert(child, defs, f"{where}.{name}") for name, child in node["properties"].items()
        }
        if not node["properties"]:
            del node["properties"]
    if "required" in node:
        node["required"] = sorted(node["required"])
    if "items" in node:
        node["items"] = _convert(node["items"], defs, f"{where}[]")
    if isinstance(node.get("additionalProperties"), dict):
        node["additionalProperties"] = _convert(node["additionalProperties"], defs, f"{where}{{}}")

    unknown = set(node) - _ALLOWED_KEYS
    if unknown:
        raise SchemaError(f"{where}: unsupported schema keys {sorted(unknown)}")
    if not partial and "type" not in node and not node.get("x-kubernetes-int-or-string"):
        raise SchemaError(f"{where}: no type")
    return node


def sort_keys(value: Any) -> Any:
    """Sort mapping keys recursively; list order (enums, rules, required) is kept as given."""
    if isinstance(value, dict):
        return {key: sort_keys(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [sort_keys(item) for item in value]
    return value


def structural_schema(model: type[BaseModel], *, sort: bool = True) -> dict[str, Any]:
    """The structural schema of `model`; keys sorted, or with `sort=False` properties in declaration order."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.pop("$defs", {})
    converted = _convert(raw, defs, model.__name__)
    return sort_keys(converted) if sort else converted
