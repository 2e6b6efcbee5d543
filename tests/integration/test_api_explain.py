"""`kubectl explain` has a description for every field.

The apiserver's published OpenAPI v3 schema carries the descriptions generated from the models' docstrings."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from specdeploy_operator.crdgen import KINDS, custom_resource_definition

from tests.conftest import Kubectl, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("install_crds")]


def properties(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every property under `schema` (through list items), with its dotted path."""
    if schema.get("type") == "array" and "items" in schema:
        yield from properties(schema["items"], path)
        return
    for name, child in schema.get("properties", {}).items():
        yield f"{path}.{name}", child
        yield from properties(child, f"{path}.{name}")


def published(kubectl: Kubectl) -> dict[str, Any]:
    def fetch() -> dict[str, Any] | None:
        result = kubectl("get", "--raw", "/openapi/v3/apis/specdeploy.dev/v1alpha1", check=False)
        if result.returncode != 0:
            return None
        schemas: dict[str, Any] = json.loads(result.stdout)["components"]["schemas"]
        wanted = [f"dev.specdeploy.v1alpha1.{kind.resource.kind}" for kind in KINDS]
        return schemas if all(name in schemas for name in wanted) else None

    found: dict[str, Any] = wait_for(fetch, timeout=60, what="specdeploy.dev/v1alpha1 in OpenAPI v3")
    return found


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.resource.kind)
def test_every_field_is_described_in_openapi_v3(kubectl: Kubectl, kind: Any) -> None:
    schemas = published(kubectl)
    served = schemas[f"dev.specdeploy.v1alpha1.{kind.resource.kind}"]
    ours = custom_resource_definition(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for top in ("spec", "status"):
        served_fields = dict(properties(served["properties"][top], top))
        our_fields = dict(properties(ours["properties"][top], top))
        assert set(served_fields) == set(our_fields)
        undescribed = [path for path, node in served_fields.items() if not node.get("description")]
        assert undescribed == []
        for path, node in served_fields.items():
            assert node["description"] == our_fields[path]["description"], path


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        (
            "sdep.spec.placement",
            [
                "GPU product, draft placement and pod scheduling.",
                "gpuProduct",
                "gpusPerNode",
                "tolerations",
                "affinity",
                "priorityClassName",
            ],
        ),
        ("sdep.spec.placement.gpuProduct", ["nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3"]),
        ("sdep.spec.speculative.method", ["draftTarget", "promptLookup", "eagle3", "baseline for A/B"]),
        ("sdep.spec.target.build.extraArgs", ["Flags the operator derives", "are rejected"]),
        ("sdep.spec.runtime.kvCacheFreeGpuMemFraction", ["kv_cache_free_gpu_mem_fraction"]),
        ("sdep.spec.placement.affinity.nodeAffinity", ["requiredDuringSchedulingIgnoredDuringExecution"]),
        ("sdep.status.conditions", ["EnginesReady", "Available", "Progressing", "Degraded"]),
        ("eb.spec", ["What to build", "buildFlags", "builderImage", "gpuProduct", "cache"]),
    ],
)
def test_kubectl_explain(kubectl: Kubectl, path: str, expected: list[str]) -> None:
    published(kubectl)
    output = " ".join(kubectl("explain", path).stdout.split())
    for text in expected:
        assert text in output, f"{text!r} not in `kubectl explain {path}`:\n{output}"


def test_kubectl_explain_recursive_lists_every_spec_field(kubectl: Kubectl) -> None:
    published(kubectl)
    output = kubectl("explain", "sdep.spec", "--recursive").stdout
    ours = custom_resource_definition(KINDS[0])["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    names = {path.rsplit(".", 1)[1] for path, _ in properties(ours["properties"]["spec"], "spec")}
    listed = {line.split()[0] for line in output.splitlines() if line.startswith(" ") and line.strip()}
    assert names <= listed, sorted(names - listed)
