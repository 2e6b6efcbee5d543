"""Generate the CRDs (and docs/api.md) from the pydantic models: `python -m specdeploy_operator.crdgen`."""

from .crd import KINDS, custom_resource_definition, render_crds, write_crds
from .schema import SchemaError, structural_schema

__all__ = [
    "KINDS",
    "SchemaError",
    "custom_resource_definition",
    "render_crds",
    "structural_schema",
    "write_crds",
]
