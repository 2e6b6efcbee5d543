"""The shape of a case: a valid base manifest, a JSON merge patch (RFC 7386: `None` deletes a key, lists are
replaced), the path of the field the error must name, and for a cross-field rule the rule's name, whose
message the error must carry."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from specdeploy_operator.api import Rule
from specdeploy_operator.api.meta import NODE_SELECTOR_REQUIREMENT_RULES, TOLERATION_RULES
from specdeploy_operator.api.rules import (
    AUTOSCALING_RULES,
    ENGINE_CACHE_RULES,
    PLACEMENT_RULES,
    ROLLOUT_RULES,
    SERVING_RULES,
    SPEC_RULES,
    SPECULATIVE_RULES,
)

H100 = "NVIDIA-H100-80GB-HBM3"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}

ALL_RULES: dict[str, Rule[Any]] = {
    rule.name: rule
    for rule in (
        *SPEC_RULES,
        *SPECULATIVE_RULES,
        *SERVING_RULES,
        *PLACEMENT_RULES,
        *ENGINE_CACHE_RULES,
        *ROLLOUT_RULES,
        *AUTOSCALING_RULES,
        *TOLERATION_RULES,
        *NODE_SELECTOR_REQUIREMENT_RULES,
    )
}


def _manifest(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": name},
        "spec": spec,
    }


def _fp8_model(uri: str, tp: int) -> dict[str, Any]:
    return {
        "model": {"uri": uri},
        "tensorParallel": tp,
        "quantization": {"format": "fp8", "kvCacheDtype": "fp8"},
        "build": {
            "maxBatchSize": 128,
            "maxInputLen": 127000,
            "maxSeqLen": 128000,
            "gemmPlugin": "fp8",
            "gemmSwigluPlugin": "fp8",
            "extraArgs": ["--log_level=info"],
        },
    }


BASES: dict[str, dict[str, Any]] = {
    "draftTarget": _manifest(
        "base-draft-target",
        {
            "backend": "tensorrt",
            "target": _fp8_model("hf://meta-llama/Llama-3.3-70B-Instruct", 2),
            "draft": _fp8_model("hf://meta-llama/Llama-3.1-8B-Instruct", 2),
            "speculative": {"method": "draftTarget", "draftLen": 4, "maxDraftLen": 10},
            "placement": {"gpuProduct": H100, "tolerations": [GPU_TOLERATION]},
            "runtime": {"kvCacheFreeGpuMemFraction": 0.6, "draftKvCacheFreeGpuMemFraction": 0.2},
            "serving": {"port": 8000, "resources": {"requests": {"cpu": 8, "memory": "64Gi"}}},
        },
    ),
    "promptLookup": _manifest(
        "base-prompt-lookup",
        {
            "backend": "tensorrt",
            "target": {
                "model": {"uri": "hf://meta-llama/Llama-2-13b-hf"},
                "quantization": {"dtype": "float16"},
                "build": {"gemmPlugin": "float16", "maxBatchSize": 4, "maxInputLen": 3200, "maxSeqLen": 4800},
            },
            "speculative": {
                "method": "promptLookup",
                "draftLen": 10,
                "promptLookup": {"maxMatchingNgramSize": 2},
            },
            "placement": {"gpuProduct": H100},
        },
    ),
    "eagle3": _manifest(
        "base-eagle3",
        {
            "backend": "pytorch",
            "target": {"model": {"uri": "pvc://model-store/llama-70b-fp8"}, "tensorParallel": 8},
            "speculative": {
                "method": "eagle3",
                "maxDraftLen": 3,
                "eagle": {"model": {"uri": "pvc://model-store/llama-70b-eagle3"}},
            },
            "runtime": {"maxSeqLen": 8192, "enableKvCacheReuse": False},
        },
    ),
    "mtp": _manifest(
        "base-mtp",
        {
            "backend": "pytorch",
            "target": {"model": {"uri": "pvc://model-store/deepseek-r1-fp8"}, "tensorParallel": 16},
            "speculative": {"method": "mtp", "maxDraftLen": 3},
            "placement": {"gpuProduct": H100, "gpusPerNode": 8},
            "runtime": {"maxSeqLen": 8192},
        },
    ),
    "suffixAutomaton": _manifest(
        "base-suffix-automaton",
        {
            "target": {"model": {"uri": "hf://Qwen/Qwen3-8B"}},
            "speculative": {
                "method": "suffixAutomaton",
                "maxDraftLen": 8,
                "suffixAutomaton": {"globalPool": True, "globalPoolSize": 256},
            },
            "runtime": {"maxBatchSize": 128},
        },
    ),
    "pard": _manifest(
        "base-pard",
        {
            "target": {"model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"}},
            "speculative": {
                "method": "pard",
                "maxDraftLen": 8,
                "pard": {"model": {"uri": "hf://amd/PARD-Llama-3.2-1B"}},
                "suffixAutomaton": {"threshold": 6},
            },
        },
    ),
    "transformers": _manifest(
        "base-transformers",
        {
            "backend": "transformers",
            "target": {"model": {"uri": "pvc://demo-models/target"}},
            "draft": {"model": {"uri": "pvc://demo-models/draft"}},
            "speculative": {"method": "draftTarget", "draftLen": 4, "maxDraftLen": 8},
            "placement": {"device": "cpu"},
            "serving": {"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": 1, "memory": "1536Mi"}}},
            "runtime": {"maxBatchSize": 8, "maxSeqLen": 2048},
        },
    ),
    "none": _manifest(
        "base-none",
        {
            "target": {"model": {"uri": "s3://models/llama-3.3-70b"}, "tensorParallel": 2},
            "speculative": {"method": "none"},
        },
    ),
}


class _ExplicitNull:
    """A patch value that sets a field to null (a plain `None` deletes it, as in RFC 7386)."""


EXPLICIT_NULL = _ExplicitNull()


def merge_patch(base: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch of `base` with `patch` (both left unchanged)."""
    if patch is EXPLICIT_NULL:
        return None
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(base) if isinstance(base, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


@dataclass(frozen=True)
class Case:
    id: str
    base: str
    patch: dict[str, Any]
    path: str
    """The field the error must name."""
    rule: str | None = None
    """The cross-field rule that rejects the manifest, if it is one."""
    server_side_apply_only: bool = False
    """Only server-side apply rejects it (a plain create prunes explicit nulls)."""

    def manifest(self) -> dict[str, Any]:
        doc: dict[str, Any] = merge_patch(BASES[self.base], self.patch)
        doc["metadata"].setdefault("name", self.id)
        if doc["metadata"]["name"].startswith("base-"):
            doc["metadata"]["name"] = self.id
        return doc

    @property
    def message(self) -> str | None:
        return ALL_RULES[self.rule].message if self.rule else None


def patch_spec(**patch: Any) -> dict[str, Any]:
    return {"spec": patch}


def patch_target(**patch: Any) -> dict[str, Any]:
    return {"spec": {"target": patch}}


def patch_draft(**patch: Any) -> dict[str, Any]:
    return {"spec": {"draft": patch}}


def patch_build(role: str, **patch: Any) -> dict[str, Any]:
    return {"spec": {role: {"build": patch}}}


def patch_speculative(**patch: Any) -> dict[str, Any]:
    return {"spec": {"speculative": patch}}


def patch_runtime(**patch: Any) -> dict[str, Any]:
    return {"spec": {"runtime": patch}}
