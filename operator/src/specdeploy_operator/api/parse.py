"""Offline validation of manifests with the same models the CRDs are generated from.

Manifests are validated by their wire (camelCase) names only, as the apiserver does: `max_batch_size` is an
unknown field, not an alias. Explicit nulls inside spec and status are errors, as under server-side apply (a
plain create would prune them): omit a field to leave it unset. Errors name the offending field by its path
(`spec.target.tensorParallel`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from .base import API_VERSION, RULE_ERROR_TYPE
from .drafttraining import DraftTraining
from .enginebuild import EngineBuild
from .speculative import SpeculativeDeployment

__all__ = ["KINDS", "FieldError", "InvalidObjectError", "parse_object", "validate_object"]

SpecdeployObject = SpeculativeDeployment | EngineBuild | DraftTraining

KINDS: dict[str, type[SpeculativeDeployment] | type[EngineBuild] | type[DraftTraining]] = {
    "SpeculativeDeployment": SpeculativeDeployment,
    "EngineBuild": EngineBuild,
    "DraftTraining": DraftTraining,
}
"""The kinds of `specdeploy.dev/v1alpha1`, by name."""


@dataclass(frozen=True)
class FieldError:
    """One problem of a manifest: the path of the offending field and what is wrong with it."""

    path: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}: {self.message}" if self.path else self.message


class InvalidObjectError(ValueError):
    """A manifest failed validation; `errors` lists every problem found."""

    def __init__(self, errors: Sequence[FieldError]) -> None:
        super().__init__("; ".join(str(error) for error in errors))
        self.errors = list(errors)


def _path(loc: Sequence[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _field_errors(error: ValidationError) -> list[FieldError]:
    found: list[FieldError] = []
    for item in error.errors():
        loc = list(item["loc"])
        if item["type"] == RULE_ERROR_TYPE:
            for violation in item.get("ctx", {}).get("violations", []):
                relative = [part for part in violation["fieldPath"].split(".") if part]
                found.append(FieldError(_path([*loc, *relative]), violation["message"]))
            continue
        path = _path(loc)
        if item["type"] == "missing":
            message = "Required value"
        elif item["type"] == "extra_forbidden":
            message = f'unknown field "{path}"'
        else:
            message = item["msg"]
        found.append(FieldError(path, message))
    return found


def _check_name(
    doc: Mapping[str, Any], kind: type[SpeculativeDeployment] | type[EngineBuild] | type[DraftTraining]
) -> list[FieldError]:
    metadata = doc.get("metadata")
    if not isinstance(metadata, Mapping):
        return [FieldError("metadata", "Required value")]
    name = metadata.get("name")
    if name is None:
        if metadata.get("generateName"):
            return []
        return [FieldError("metadata.name", "Required value: name or generateName is required")]
    if not isinstance(name, str):
        return [FieldError("metadata.name", "must be a string")]
    info = kind.resource
    if info.name_max_length is not None and len(name) > info.name_max_length:
        return [FieldError("metadata.name", f"must be no more than {info.name_max_length} characters")]
    if info.name_pattern is not None and not re.fullmatch(info.name_pattern, name):
        return [FieldError("metadata.name", f"must match {info.name_pattern}")]
    return []


def _nulls(value: object, path: str) -> Iterator[FieldError]:
    if isinstance(value, Mapping):
        for key, child in value.items():
            child_path = f"{path}.{key}"
            if child is None:
                yield FieldError(child_path, "must not be null: omit the field to leave it unset")
            else:
                yield from _nulls(child, child_path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _nulls(item, f"{path}[{index}]")


def validate_object(doc: object) -> tuple[SpecdeployObject | None, list[FieldError]]:
    """Validate one decoded manifest; returns the parsed object (None when invalid) and the problems."""
    if not isinstance(doc, Mapping):
        return None, [FieldError("", f"expected a mapping (an object), got {type(doc).__name__}")]
    api_version = doc.get("apiVersion")
    kind_name = doc.get("kind")
    if api_version != API_VERSION:
        return None, [FieldError("apiVersion", f"expected {API_VERSION}, got {api_version!r}")]
    kind = KINDS.get(kind_name) if isinstance(kind_name, str) else None
    if kind is None:
        supported = ", ".join(KINDS)
        return None, [FieldError("kind", f"expected one of {supported}, got {kind_name!r}")]
    errors = _check_name(doc, kind)
    # A plain create prunes nulls of non-nullable fields, but server-side apply (kubectl apply --server-side,
    # GitOps tools) rejects them; so does the offline validator.
    for section in ("spec", "status"):
        errors += _nulls(doc.get(section), section)
    try:
        parsed = kind.model_validate(doc, by_alias=True, by_name=False)
    except ValidationError as error:
        return None, [*errors, *_field_errors(error)]
    return (None if errors else parsed), errors


def parse_object(doc: object) -> SpecdeployObject:
    """Validate one decoded manifest and return the model; raises `InvalidObjectError` with every problem."""
    parsed, errors = validate_object(doc)
    if parsed is None:
        raise InvalidObjectError(errors)
    return parsed
