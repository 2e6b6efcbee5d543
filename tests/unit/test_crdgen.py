"""The generated CRDs and docs: current, structural, described, and CEL-ready."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_operator.crdgen import KINDS, custom_resource_definition, render_crds
from specdeploy_operator.crdgen.__main__ import main as crdgen_main
from specdeploy_operator.crdgen.docs import render_api_docs
from specdeploy_operator.crdgen.policy import POLICY_FILENAME

REPO = Path(__file__).resolve().parents[2]


def walk(schema: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every schema node under `schema` with its path (`spec.target.model.uri`, `...tolerations[]`)."""
    yield path, schema
    for name, child in schema.get("properties", {}).items():
        yield from walk(child, f"{path}.{name}")
    if "items" in schema:
        yield from walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        yield from walk(schema["additionalProperties"], f"{path}{{}}")


def root_schema(kind: Any) -> dict[str, Any]:
    schema: dict[str, Any] = custom_resource_definition(kind)["spec"]["versions"][0]["schema"][
        "openAPIV3Schema"
    ]
    return schema


@pytest.mark.parametrize("name", sorted(render_crds()))
def test_committed_crds_are_current(name: str) -> None:
    committed = REPO / "crds" / name
    assert committed.is_file(), f"{committed} missing: run `make crds`"
    assert committed.read_text() == render_crds()[name], f"{committed} is stale: run `make crds`"


def test_committed_api_docs_are_current() -> None:
    docs = REPO / "docs" / "api.md"
    assert docs.read_text() == render_api_docs(), "docs/api.md is stale: run `make crds`"


def test_generator_check_mode_and_other_directories(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    assert crdgen_main(["--check", "--docs", "docs/api.md"]) == 0
    chart_crds = tmp_path / "chart" / "crds"
    assert crdgen_main(["--out-dir", str(chart_crds), "--docs", str(tmp_path / "api.md")]) == 0
    for name, text in render_crds().items():
        assert (chart_crds / name).read_text() == text
    assert crdgen_main(["--check", "--out-dir", str(chart_crds)]) == 0
    (chart_crds / next(iter(render_crds()))).write_text("stale")
    assert crdgen_main(["--check", "--out-dir", str(chart_crds)]) == 1


def test_output_is_deterministic() -> None:
    assert render_crds() == render_crds()
    assert render_api_docs() == render_api_docs()


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.resource.kind)
def test_schema_is_structural(kind: Any) -> None:
    forbidden = {"$ref", "$defs", "title", "allOf", "oneOf", "not", "nullable", "const", "discriminator"}
    for path, node in walk(root_schema(kind), ""):
        assert not forbidden & set(node), f"{path}: {sorted(forbidden & set(node))}"
        if node.get("x-kubernetes-int-or-string"):
            assert node["anyOf"] == [{"type": "integer"}, {"type": "string"}], path
            assert "type" not in node, path
        elif path != ".metadata":
            assert "type" in node, path
            assert "anyOf" not in node, path
        assert "x-kubernetes-preserve-unknown-fields" not in node, f"{path}: everything is typed"
        if "properties" in node:
            assert "additionalProperties" not in node, path
        for bound in ("exclusiveMinimum", "exclusiveMaximum"):
            assert node.get(bound, True) is True, f"{path}: {bound} must be boolean in OpenAPI v3"


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.resource.kind)
def test_every_field_has_a_description(kind: Any) -> None:
    """What `kubectl explain` prints: every property of spec and status is described."""
    root = root_schema(kind)
    missing = [
        path
        for top in ("spec", "status")
        for path, node in walk(root["properties"][top], top)
        if not path.endswith(("[]", "{}")) and not node.get("description")
    ]
    assert missing == []


def test_placement_is_explainable() -> None:
    placement = root_schema(KINDS[0])["properties"]["spec"]["properties"]["placement"]
    assert "GPU product" in placement["description"]
    assert "nvidia.com/gpu.product" in placement["properties"]["gpuProduct"]["description"]
    toleration = placement["properties"]["tolerations"]["items"]
    assert toleration["properties"]["operator"]["enum"] == ["Exists", "Equal"]


def test_spec_defaults_and_enums_are_in_the_schema() -> None:
    spec = root_schema(KINDS[0])["properties"]["spec"]
    props = spec["properties"]
    assert spec["required"] == ["speculative", "target"]
    assert props["replicas"]["default"] == 1
    assert props["backend"] == {
        **props["backend"],
        "default": "pytorch",
        "enum": ["tensorrt", "pytorch", "transformers"],
    }
    assert props["speculative"]["properties"]["maxDraftLen"]["default"] == 10
    assert props["speculative"]["properties"]["method"]["enum"] == [
        "draftTarget",
        "promptLookup",
        "ngram",
        "suffixAutomaton",
        "eagle3",
        "mtp",
        "pard",
        "dflash",
        "none",
    ]
    assert props["placement"]["default"] == {}
    assert props["placement"]["properties"]["gpuResource"]["default"] == "nvidia.com/gpu"
    assert props["placement"]["properties"]["gpusPerNode"]["default"] == 8
    assert props["rollout"]["properties"]["maxSurge"]["default"] == 0
    assert props["rollout"]["properties"]["maxUnavailable"]["default"] == 1
    assert props["serving"]["properties"]["port"]["default"] == 8000
    quantization = props["target"]["properties"]["quantization"]
    assert quantization["default"] == {}
    assert quantization["properties"]["calibSize"]["default"] == 512
    fraction = props["runtime"]["properties"]["kvCacheFreeGpuMemFraction"]
    assert (fraction["minimum"], fraction["exclusiveMinimum"], fraction["maximum"]) == (0, True, 1)


def test_resource_shape() -> None:
    crd = custom_resource_definition(KINDS[0])
    assert crd["metadata"]["name"] == "speculativedeployments.specdeploy.dev"
    assert crd["spec"]["scope"] == "Namespaced"
    assert crd["spec"]["names"]["shortNames"] == ["sdep", "specdeploy"]
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = [column["name"] for column in version["additionalPrinterColumns"] if not column.get("priority")]
    assert columns == [
        "Phase",
        "Method",
        "Target",
        "Draft",
        "Ready",
        "Acceptance",
        "Tokens/step",
        "GPUs/replica",
        "Age",
    ]
    engine_build = custom_resource_definition(KINDS[1])
    assert engine_build["spec"]["names"]["shortNames"] == ["eb"]
    eb_columns = engine_build["spec"]["versions"][0]["additionalPrinterColumns"]
    assert [column["name"] for column in eb_columns if not column.get("priority")] == [
        "Model",
        "Role",
        "TP",
        "Phase",
        "Age",
    ]


def _resolve(root: dict[str, Any], base: str, field_path: str) -> dict[str, Any] | None:
    node: dict[str, Any] | None = dict(walk(root, "")).get(base)
    for part in field_path.strip(".").split("."):
        if node is None:
            return None
        node = node.get("properties", {}).get(part)
    return node


@pytest.mark.parametrize("kind", KINDS, ids=lambda kind: kind.resource.kind)
def test_cel_rules_are_well_formed(kind: Any) -> None:
    root = root_schema(kind)
    found = 0
    for path, node in walk(root, ""):
        for rule in node.get("x-kubernetes-validations", []):
            found += 1
            assert set(rule) <= {"rule", "message", "fieldPath", "reason"}, rule
            assert "\n" not in rule["message"]
            assert "\n" not in rule["rule"]
            assert "spec" in rule["message"], rule
            assert _resolve(root, path, rule["fieldPath"]) is not None, (
                f"{path}: bad fieldPath {rule['fieldPath']}"
            )
    assert found


def test_lists_and_strings_used_by_cel_are_bounded() -> None:
    """Unbounded lists/strings make the apiserver's CEL cost estimate exceed its budget."""
    build = root_schema(KINDS[0])["properties"]["spec"]["properties"]["target"]["properties"]["build"]
    extra_args = build["properties"]["extraArgs"]
    assert extra_args["maxItems"] <= 64
    assert extra_args["items"]["maxLength"] <= 256


def test_crd_files_are_valid_yaml_with_a_header() -> None:
    files = render_crds()
    policy = files.pop(POLICY_FILENAME)
    assert [d["kind"] for d in yaml.safe_load_all(policy)] == [
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    ]
    for name, text in files.items():
        assert text.startswith("# Generated by"), name
        document = yaml.safe_load(text)
        assert document["kind"] == "CustomResourceDefinition"
        assert name == f"{document['spec']['group']}_{document['spec']['names']['plural']}.yaml"


def test_docs_cover_every_field() -> None:
    docs = render_api_docs()
    for kind in KINDS:
        root = root_schema(kind)
        for top in ("spec", "status"):
            for path, node in walk(root["properties"][top], top):
                if "properties" in node:
                    section = path.replace("{}", "")
                    assert f"`{section}`" in docs, section
                    for name in node["properties"]:
                        assert f"| `{name}`" in docs, f"{section}.{name}"
    assert "| `maxDraftLen` | integer; >= 1, <= 64 | `10` |" in docs
