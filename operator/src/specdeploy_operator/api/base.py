"""Building blocks shared by every API model.

`ApiModel` is the base of all spec and status types: camelCase on the wire, unknown fields rejected, strict
types (a string is never coerced into a number, as the apiserver would refuse it too), attribute docstrings
become field descriptions (and so CRD descriptions and `kubectl explain` text).

`Rule` is one cross-field rule written twice, side by side: as a CEL expression that the generator places into
the CRD's `x-kubernetes-validations`, and as a Python predicate that the same model runs during validation.
Keeping both in one object is what keeps the offline validator and the apiserver in agreement; the unit tests
run every invalid manifest through pydantic and the integration tests run the same manifests through the
apiserver."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

__all__ = [
    "API_VERSION",
    "GROUP",
    "RULE_ERROR_TYPE",
    "VERSION",
    "ApiModel",
    "PrinterColumn",
    "ResourceInfo",
    "Rule",
    "RuleReason",
    "Rules",
]

GROUP = "specdeploy.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

M = TypeVar("M", bound="ApiModel")

RuleReason = Literal["FieldValueInvalid", "FieldValueForbidden", "FieldValueRequired", "FieldValueDuplicate"]

RULE_ERROR_TYPE = "specdeploy_rule"
"""pydantic error type of a failed `Rule`; its `ctx["violations"]` lists every failed rule of one object."""


@dataclass(frozen=True)
class Rule(Generic[M]):
    """A cross-field validation rule, as CEL for the apiserver and as a Python predicate for offline
    validation."""

    name: str
    """Stable identifier, used by tests to refer to the rule."""
    cel: str
    """CEL expression over `self` (the object the rule is attached to); true means valid."""
    message: str
    """Error text; it names the offending field by its full path, e.g. `spec.draft is required when ...`."""
    field_path: str
    """Path of the offending field relative to the object the rule is attached to, e.g. `.draft`."""
    check: Callable[[M], bool] | None
    """Python twin of `cel`; None only for transition rules (`oldSelf`), which need the stored object."""
    reason: RuleReason = "FieldValueInvalid"

    def to_crd(self) -> dict[str, str]:
        """The rule as one entry of `x-kubernetes-validations`."""
        entry = {"rule": self.cel, "message": self.message, "fieldPath": self.field_path}
        if self.reason != "FieldValueInvalid":
            entry["reason"] = self.reason
        return entry


Rules = tuple[Rule[Any], ...]
"""The rules of one object type."""


def _add_rules_to_schema(schema: dict[str, Any], cls: type[Any]) -> None:
    rules: tuple[Rule[Any], ...] = getattr(cls, "validation_rules", ())
    if rules:
        schema["x-kubernetes-validations"] = [rule.to_crd() for rule in rules]


class ApiModel(BaseModel):
    """Base of every specdeploy API type."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        # Manifests are validated by alias only (see `specdeploy_operator.api.parse_object`); Python code may
        # construct models with snake_case keyword arguments.
        validate_by_alias=True,
        validate_by_name=True,
        serialize_by_alias=True,
        extra="forbid",
        strict=True,
        frozen=True,
        use_attribute_docstrings=True,
        json_schema_extra=_add_rules_to_schema,
    )

    validation_rules: ClassVar[Rules] = ()
    """Cross-field rules of this object, enforced here and rendered into the CRD."""

    @model_validator(mode="after")
    def _enforce_rules(self) -> Self:
        failed = [rule for rule in self.validation_rules if rule.check is not None and not rule.check(self)]
        if failed:
            raise PydanticCustomError(
                RULE_ERROR_TYPE,
                "{summary}",
                {
                    "summary": "; ".join(rule.message for rule in failed),
                    "violations": [
                        {"rule": rule.name, "fieldPath": rule.field_path, "message": rule.message}
                        for rule in failed
                    ],
                },
            )
        return self

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict in wire form (camelCase, unset optional fields left out)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


@dataclass(frozen=True)
class PrinterColumn:
    """One `additionalPrinterColumns` entry (`kubectl get` column)."""

    name: str
    type: Literal["string", "integer", "number", "boolean", "date"]
    json_path: str
    description: str
    priority: int = 0


@dataclass(frozen=True)
class ResourceInfo:
    """How a top-level kind is served: names, columns and subresources. Declared next to the kind's model."""

    group: str
    version: str
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    printer_columns: tuple[PrinterColumn, ...]
    scale: tuple[str, str, str] | None = None
    """(specReplicasPath, statusReplicasPath, labelSelectorPath) of the scale subresource, if any."""
    name_max_length: int | None = None
    name_pattern: str | None = None

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}"

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{self.group}"
