"""The SpeculativeDeployment and EngineBuild models: defaults, every rule, and offline validation errors."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError
from specdeploy_operator.api import (
    EngineBuild,
    EngineBuildSpec,
    InvalidObjectError,
    ModelSpec,
    SpeculativeDeployment,
    SpeculativeDeploymentSpec,
    parse_object,
    validate_object,
)

from tests.unit.api_cases import ALL_RULES, BASES, INVALID_CASES, RULE_CASES, Case, merge_patch


def minimal(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": "m"},
        "spec": {"target": {"model": {"uri": "hf://org/model"}}, "speculative": {"method": "none"}, **spec},
    }


def parse_sdep(doc: dict[str, Any]) -> SpeculativeDeployment:
    parsed = parse_object(doc)
    assert isinstance(parsed, SpeculativeDeployment)
    return parsed


def test_defaults_of_a_minimal_manifest() -> None:
    spec = parse_sdep(minimal()).spec
    assert spec.to_dict() == {
        "replicas": 1,
        "backend": "pytorch",
        "target": {
            "model": {"uri": "hf://org/model"},
            "tensorParallel": 1,
            "pipelineParallel": 1,
            "quantization": {"format": "none", "kvCacheDtype": "auto", "calibSize": 512, "dtype": "auto"},
        },
        "speculative": {"method": "none", "maxDraftLen": 10, "acceptance": "tokenMatch"},
        "placement": {
            "device": "gpu",
            "draft": "colocated",
            "gpuResource": "nvidia.com/gpu",
            "gpusPerNode": 8,
        },
        "runtime": {"enableKvCacheReuse": True},
        "serving": {"port": 8000},
        "rollout": {"maxSurge": 0, "maxUnavailable": 1},
    }
    assert spec.gpus_per_replica == 1
    assert spec.speculative.effective_draft_len == "auto"  # unpinned: the load-aware choice


def test_a_pinned_draft_len_or_auto_and_a_concurrency_ceiling_are_accepted() -> None:
    pinned = parse_sdep(minimal(speculative={"method": "promptLookup", "draftLen": 3}))
    assert pinned.spec.speculative.effective_draft_len == 3
    auto = parse_sdep(
        minimal(speculative={"method": "promptLookup", "draftLen": "auto", "disableAboveConcurrency": 16})
    )
    assert auto.spec.speculative.effective_draft_len == "auto"
    assert auto.spec.speculative.disable_above_concurrency == 16


def test_nested_defaults() -> None:
    spec = parse_sdep(
        minimal(
            speculative={"method": "promptLookup", "promptLookup": {}},
            autoscaling={"maxReplicas": 3},
            serving={"chatTemplateConfigMap": {"name": "templates"}},
        )
    ).spec
    assert spec.speculative.prompt_lookup is not None
    assert spec.speculative.prompt_lookup.max_matching_ngram_size == 2
    assert spec.autoscaling is not None
    auto = spec.autoscaling
    assert (auto.engine, auto.min_replicas, auto.metric, auto.target_value) == ("hpa", 1, "queueSeconds", 10)
    assert (auto.scale_up.stabilization_window_seconds, auto.scale_down.stabilization_window_seconds) == (
        0,
        600,
    )
    assert spec.serving.chat_template_config_map is not None
    assert spec.serving.chat_template_config_map.key == "chat_template.j2"


def test_explicit_nulls_are_rejected() -> None:
    """seed 000's runtime.json has nulls; a manifest must omit them (server-side apply rejects them)."""
    tolerations = [{"key": None, "operator": "Exists"}]
    doc = minimal(runtime={"crossKvCacheFraction": None}, placement={"tolerations": tolerations})
    assert [str(error) for error in validate_object(doc)[1]] == [
        "spec.runtime.crossKvCacheFraction: must not be null: omit the field to leave it unset",
        "spec.placement.tolerations[0].key: must not be null: omit the field to leave it unset",
    ]
    assert validate_object(minimal(runtime={}))[1] == []


@pytest.mark.parametrize("name", sorted(BASES))
def test_case_bases_are_valid(name: str) -> None:
    parsed, errors = validate_object(BASES[name])
    assert errors == []
    assert parsed is not None


@pytest.mark.parametrize("case", INVALID_CASES, ids=lambda case: case.id)
def test_invalid_manifest_is_rejected_naming_the_field(case: Case) -> None:
    parsed, errors = validate_object(case.manifest())
    assert parsed is None
    assert errors, "expected at least one error"
    named = [error for error in errors if error.path == case.path or error.path.startswith(case.path + ".")]
    assert named, f"no error names {case.path}: {[str(e) for e in errors]}"
    if case.message is not None:
        assert any(error.path == case.path and error.message == case.message for error in errors), errors
        assert names_the_field(case.message, case.path), (case.message, case.path)


def names_the_field(message: str, path: str) -> bool:
    """The message names the field, or its parent; a rule of a type used at several places (a toleration, a
    node selector requirement) names the field it sits under, without list indices."""
    if path in message or path.rsplit(".", 1)[0] in message:
        return True
    named = message.split(":", 1)[0]
    return named.startswith("spec.") and re.sub(r"\[\d+\]", "", path).startswith(named + ".")


def test_there_are_at_least_forty_distinct_invalid_cases() -> None:
    assert len({case.id for case in INVALID_CASES}) == len(INVALID_CASES) >= 40
    manifests = {repr(case.manifest()["spec"]) + repr(case.manifest()["metadata"]) for case in INVALID_CASES}
    assert len(manifests) == len(INVALID_CASES)


def test_every_checkable_rule_has_a_case() -> None:
    covered = {case.rule for case in RULE_CASES}
    checkable = {name for name, rule in ALL_RULES.items() if rule.check is not None}
    assert checkable <= covered, sorted(checkable - covered)


@pytest.mark.parametrize("name", sorted(ALL_RULES))
def test_rule_messages_name_a_field_path(name: str) -> None:
    rule = ALL_RULES[name]
    assert "spec." in rule.message
    assert "\n" not in rule.message
    assert rule.field_path.startswith(".")


def test_all_errors_are_reported_together() -> None:
    doc = merge_patch(
        BASES["draftTarget"],
        {"spec": {"draft": {"tensorParallel": 4}, "runtime": {"enableKvCacheReuse": False}}},
    )
    _, errors = validate_object(doc)
    assert {error.path for error in errors} == {
        "spec.draft.tensorParallel",
        "spec.runtime.enableKvCacheReuse",
    }


def test_parse_object_raises_with_every_error() -> None:
    with pytest.raises(InvalidObjectError) as raised:
        parse_object(minimal(replicas=-1, backend="onnx"))
    assert {error.path for error in raised.value.errors} == {"spec.replicas", "spec.backend"}


@pytest.mark.parametrize(
    ("doc", "path"),
    [
        ([1, 2], ""),
        ({"apiVersion": "apps/v1", "kind": "Deployment"}, "apiVersion"),
        ({"apiVersion": "specdeploy.dev/v1alpha1", "kind": "Deployment"}, "kind"),
        ({"apiVersion": "specdeploy.dev/v1alpha1", "kind": "SpeculativeDeployment", "spec": {}}, "metadata"),
    ],
)
def test_documents_that_are_not_ours(doc: Any, path: str) -> None:
    parsed, errors = validate_object(doc)
    assert parsed is None
    assert [error.path for error in errors][:1] == [path]


def test_generate_name_is_accepted() -> None:
    doc = minimal()
    doc["metadata"] = {"generateName": "llama-"}
    assert validate_object(doc)[1] == []


def test_status_round_trip() -> None:
    doc = minimal()
    doc["status"] = {
        "phase": "Ready",
        "observedGeneration": 2,
        "replicas": 2,
        "readyReplicas": 2,
        "readyText": "2/2",
        "selector": "specdeploy.dev/name=m",
        "endpoint": "http://m.default.svc:8000/v1",
        "gpusPerReplica": 2,
        "engines": {
            "target": {"name": "eb-0123456789abcdef", "hash": "0123456789abcdef", "phase": "Succeeded"}
        },
        "conditions": [
            {
                "type": "Available",
                "status": "True",
                "observedGeneration": 2,
                "lastTransitionTime": "2026-01-02T03:04:05Z",
                "reason": "ReplicasReady",
                "message": "2 of 2 replicas ready",
            }
        ],
    }
    parsed = parse_sdep(doc)
    assert parsed.status is not None
    assert parsed.status.to_dict()["conditions"][0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    assert parsed.status.to_dict() == doc["status"]


def test_status_rejects_unknown_phase() -> None:
    doc = minimal()
    doc["status"] = {"phase": "Running"}
    assert [error.path for error in validate_object(doc)[1]] == ["status.phase"]


def test_python_construction_uses_snake_case() -> None:
    spec = SpeculativeDeploymentSpec(
        target=ModelSpec.model_validate({"model": {"uri": "hf://a/b"}, "tensor_parallel": 2}),
        speculative={"method": "none"},  # type: ignore[arg-type]
    )
    assert spec.target.tensor_parallel == 2
    assert spec.to_dict()["target"]["tensorParallel"] == 2


def test_models_are_frozen() -> None:
    spec = parse_sdep(minimal()).spec
    with pytest.raises(ValidationError):
        spec.replicas = 3


# --- EngineBuild---------------------------------------------------------------------------------------------


def engine_build(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "model": {"uri": "hf://meta-llama/Llama-3.3-70B-Instruct", "credentialsSecret": "hf-token"},
        "role": "target",
        "parallelism": {"tensorParallel": 2},
        "quantization": {"format": "fp8", "kvCacheDtype": "fp8"},
        "buildFlags": ["--max_batch_size", "128", "--use_paged_context_fmha", "enable"],
        "hash": "0123456789abcdef",
        "builderImage": "nvcr.io/nvidia/tensorrt-llm/release:0.15.0",
        "gpuProduct": "NVIDIA-H100-80GB-HBM3",
        "cache": {"pvcName": "engine-cache", "path": "engines/0123456789abcdef"},
    }
    body.update(spec)
    return {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "EngineBuild",
        "metadata": {"name": "llama-70b-target-0123456789abcdef"},
        "spec": body,
    }


def test_engine_build_parses_with_defaults() -> None:
    parsed = parse_object(engine_build())
    assert isinstance(parsed, EngineBuild)
    assert parsed.spec.parallelism.pipeline_parallel == 1
    assert parsed.spec.quantization.calib_size == 512


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"role": "verifier"}, "spec.role"),
        ({"hash": "XYZ"}, "spec.hash"),
        ({"gpuProduct": "NVIDIA H100"}, "spec.gpuProduct"),
        ({"cache": {"pvcName": "engine-cache"}}, "spec.cache.path"),
        ({"buildFlags": None}, "spec.buildFlags"),
    ],
)
def test_engine_build_rejects(patch: dict[str, Any], path: str) -> None:
    doc = engine_build(**{k: v for k, v in patch.items() if v is not None})
    for key, value in patch.items():
        if value is None:
            del doc["spec"][key]
    assert path in [error.path for error in validate_object(doc)[1]]


def test_engine_hash_covers_the_engine_and_its_claim_not_the_path_or_credentials() -> None:
    spec = EngineBuildSpec.model_validate(engine_build()["spec"])
    cache = {"pvcName": spec.cache.pvc_name, "path": "x"}
    same = EngineBuildSpec.model_validate(engine_build(cache=cache, model={"uri": spec.model.uri})["spec"])
    other = EngineBuildSpec.model_validate(engine_build(buildFlags=["--max_batch_size", "64"])["spec"])
    elsewhere = EngineBuildSpec.model_validate(engine_build(cache={"pvcName": "other", "path": "x"})["spec"])
    assert spec.content_hash() == same.content_hash()
    assert spec.content_hash() != other.content_hash()
    assert spec.content_hash() != elsewhere.content_hash(), "an engine in another claim is another artifact"
    assert len(spec.content_hash()) == 16
    assert int(spec.content_hash(), 16) >= 0
