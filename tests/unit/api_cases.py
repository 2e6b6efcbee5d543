"""Invalid SpeculativeDeployment manifests, shared by the unit tests (pydantic) and the integration tests (the
real apiserver), so that both validators are held to the same cases.

Each case is a valid base manifest plus a JSON merge patch (RFC 7386: `None` deletes a key, lists are
replaced) and the path of the field the error must name. Cases of a cross-field rule also name the rule; the
error must then carry that rule's message."""

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


def _spec(**patch: Any) -> dict[str, Any]:
    return {"spec": patch}


def _target(**patch: Any) -> dict[str, Any]:
    return {"spec": {"target": patch}}


def _draft(**patch: Any) -> dict[str, Any]:
    return {"spec": {"draft": patch}}


def _build(role: str, **patch: Any) -> dict[str, Any]:
    return {"spec": {role: {"build": patch}}}


def _speculative(**patch: Any) -> dict[str, Any]:
    return {"spec": {"speculative": patch}}


def _runtime(**patch: Any) -> dict[str, Any]:
    return {"spec": {"runtime": patch}}


SCHEMA_CASES = [
    Case("replicas-negative", "none", _spec(replicas=-1), "spec.replicas"),
    Case("replicas-string", "none", _spec(replicas="2"), "spec.replicas"),
    Case("backend-unknown", "none", _spec(backend="onnx"), "spec.backend"),
    Case(
        "env-name-with-equals", "none", _spec(serving={"env": [{"name": "A=B"}]}), "spec.serving.env[0].name"
    ),
    Case("method-unknown", "none", _speculative(method="medusa"), "spec.speculative.method"),
    Case("method-missing", "none", _speculative(method=None), "spec.speculative.method"),
    Case("speculative-missing", "none", _spec(speculative=None), "spec.speculative"),
    Case("target-missing", "none", _spec(target=None), "spec.target"),
    Case("target-uri-missing", "none", _target(model={"uri": None}), "spec.target.model.uri"),
    Case("target-uri-http", "none", _target(model={"uri": "http://example.com/m"}), "spec.target.model.uri"),
    Case("target-uri-hf-no-name", "none", _target(model={"uri": "hf://meta-llama"}), "spec.target.model.uri"),
    Case("draft-uri-ftp", "draftTarget", _draft(model={"uri": "ftp://host/model"}), "spec.draft.model.uri"),
    Case(
        "eagle-uri-unknown-scheme",
        "eagle3",
        _speculative(eagle={"model": {"uri": "file:///models/eagle3"}}),
        "spec.speculative.eagle.model.uri",
    ),
    Case(
        "credentials-secret-bad-name",
        "none",
        _target(model={"credentialsSecret": "My_Token"}),
        "spec.target.model.credentialsSecret",
    ),
    Case("target-tp-zero", "none", _target(tensorParallel=0), "spec.target.tensorParallel"),
    Case("target-tp-too-large", "none", _target(tensorParallel=65), "spec.target.tensorParallel"),
    Case(
        "quantization-format-unknown",
        "none",
        _target(quantization={"format": "fp4"}),
        "spec.target.quantization.format",
    ),
    Case(
        "kv-cache-dtype-unknown",
        "draftTarget",
        _draft(quantization={"kvCacheDtype": "fp16"}),
        "spec.draft.quantization.kvCacheDtype",
    ),
    Case(
        "calib-size-zero",
        "none",
        _target(quantization={"calibSize": 0}),
        "spec.target.quantization.calibSize",
    ),
    Case(
        "dtype-float32", "none", _target(quantization={"dtype": "float32"}), "spec.target.quantization.dtype"
    ),
    Case(
        "gemm-plugin-unknown",
        "draftTarget",
        _build("target", gemmPlugin="fp16"),
        "spec.target.build.gemmPlugin",
    ),
    Case(
        "fused-mlp-boolean",
        "draftTarget",
        _build("target", useFusedMlp=True),
        "spec.target.build.useFusedMlp",
    ),
    Case(
        "swiglu-plugin-float16",
        "draftTarget",
        _build("draft", gemmSwigluPlugin="float16"),
        "spec.draft.build.gemmSwigluPlugin",
    ),
    Case(
        "max-batch-size-zero",
        "draftTarget",
        _build("target", maxBatchSize=0),
        "spec.target.build.maxBatchSize",
    ),
    Case(
        "extra-args-whitespace",
        "draftTarget",
        _build("target", extraArgs=["--log_level info"]),
        "spec.target.build.extraArgs[0]",
    ),
    Case(
        "extra-args-too-many",
        "draftTarget",
        _build("target", extraArgs=["--log_level=info"] * 65),
        "spec.target.build.extraArgs",
    ),
    Case("draft-len-zero", "draftTarget", _speculative(draftLen=0), "spec.speculative.draftLen"),
    Case(
        "draft-len-65", "draftTarget", _speculative(draftLen=65, maxDraftLen=64), "spec.speculative.draftLen"
    ),
    Case("draft-len-unknown-word", "draftTarget", _speculative(draftLen="fast"), "spec.speculative.draftLen"),
    Case(
        "disable-above-concurrency-zero",
        "draftTarget",
        _speculative(disableAboveConcurrency=0),
        "spec.speculative.disableAboveConcurrency",
    ),
    Case("max-draft-len-65", "draftTarget", _speculative(maxDraftLen=65), "spec.speculative.maxDraftLen"),
    Case(
        "acceptance-unknown",
        "draftTarget",
        _speculative(acceptance="sampling"),
        "spec.speculative.acceptance",
    ),
    Case(
        "ngram-size-zero",
        "promptLookup",
        _speculative(promptLookup={"maxMatchingNgramSize": 0}),
        "spec.speculative.promptLookup.maxMatchingNgramSize",
    ),
    Case("placement-unknown", "draftTarget", _spec(placement={"draft": "shared"}), "spec.placement.draft"),
    Case(
        "gpu-product-with-space",
        "none",
        _spec(placement={"gpuProduct": "NVIDIA H100"}),
        "spec.placement.gpuProduct",
    ),
    Case("device-unknown", "transformers", _spec(placement={"device": "tpu"}), "spec.placement.device"),
    Case("gpus-per-node-zero", "none", _spec(placement={"gpusPerNode": 0}), "spec.placement.gpusPerNode"),
    Case(
        "toleration-operator-unknown",
        "none",
        _spec(placement={"tolerations": [{"key": "nvidia.com/gpu", "operator": "Matches"}]}),
        "spec.placement.tolerations[0].operator",
    ),
    Case(
        "node-affinity-operator-unknown",
        "none",
        _spec(
            placement={
                "affinity": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {"matchExpressions": [{"key": "zone", "operator": "Near", "values": ["a"]}]}
                            ]
                        }
                    }
                }
            }
        ),
        "spec.placement.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator",
    ),
    Case(
        "node-selector-integer-value",
        "none",
        _spec(placement={"nodeSelector": {"pool": 5}}),
        "spec.placement.nodeSelector",
    ),
    Case(
        "node-selector-value-not-a-label-value",
        "none",
        _spec(placement={"nodeSelector": {"pool": "not a label value!"}}),
        "spec.placement.nodeSelector.pool",
    ),
    Case(
        "kv-fraction-zero",
        "none",
        _runtime(kvCacheFreeGpuMemFraction=0),
        "spec.runtime.kvCacheFreeGpuMemFraction",
    ),
    Case(
        "draft-kv-fraction-above-one",
        "draftTarget",
        _runtime(draftKvCacheFreeGpuMemFraction=1.5),
        "spec.runtime.draftKvCacheFreeGpuMemFraction",
    ),
    Case(
        "cross-kv-fraction-negative",
        "none",
        _runtime(crossKvCacheFraction=-0.1),
        "spec.runtime.crossKvCacheFraction",
    ),
    Case(
        "kv-reuse-string",
        "draftTarget",
        _runtime(enableKvCacheReuse="yes"),
        "spec.runtime.enableKvCacheReuse",
    ),
    Case(
        "offload-priority-above-100",
        "none",
        _runtime(secondaryOffloadMinPriority=101),
        "spec.runtime.secondaryOffloadMinPriority",
    ),
    Case(
        "runtime-max-seq-len-one",
        "transformers",
        _runtime(maxSeqLen=1),
        "spec.runtime.maxSeqLen",
    ),
    Case("port-zero", "none", _spec(serving={"port": 0}), "spec.serving.port"),
    Case("port-too-large", "none", _spec(serving={"port": 70000}), "spec.serving.port"),
    Case(
        "cpu-not-a-quantity",
        "draftTarget",
        _spec(serving={"resources": {"requests": {"cpu": "lots"}}}),
        "spec.serving.resources.requests.cpu",
    ),
    Case(
        "server-gpu-resources",
        "none",
        _spec(serving={"resources": {"limits": {"nvidia.com/gpu": 1}}}),
        "spec.serving.resources.limits.nvidia.com/gpu",
    ),
    Case("cache-size-not-a-quantity", "none", _spec(engineCache={"size": "big"}), "spec.engineCache.size"),
    Case("max-surge-150-percent", "none", _spec(rollout={"maxSurge": "150%"}), "spec.rollout.maxSurge"),
    Case(
        "max-unavailable-negative",
        "none",
        _spec(rollout={"maxUnavailable": -1}),
        "spec.rollout.maxUnavailable",
    ),
    Case(
        "autoscaling-metric-unknown",
        "none",
        _spec(autoscaling={"maxReplicas": 4, "metric": "gpuUtilization"}),
        "spec.autoscaling.metric",
    ),
    Case(
        "autoscaling-engine-unknown",
        "none",
        _spec(autoscaling={"maxReplicas": 4, "engine": "vpa"}),
        "spec.autoscaling.engine",
    ),
    Case(
        "autoscaling-scale-down-window-too-long",
        "none",
        _spec(autoscaling={"maxReplicas": 4, "scaleDown": {"stabilizationWindowSeconds": 7200}}),
        "spec.autoscaling.scaleDown.stabilizationWindowSeconds",
    ),
    Case(
        "autoscaling-target-not-positive",
        "none",
        _spec(autoscaling={"maxReplicas": 4, "target": 0}),
        "spec.autoscaling.target",
    ),
    Case(
        "autoscaling-keda-address-not-url",
        "none",
        _spec(autoscaling={"maxReplicas": 4, "engine": "keda", "keda": {"serverAddress": "prometheus:9090"}}),
        "spec.autoscaling.keda.serverAddress",
    ),
    Case(
        "serving-grace-too-short",
        "none",
        _spec(serving={"terminationGracePeriodSeconds": 1}),
        "spec.serving.terminationGracePeriodSeconds",
    ),
    Case(
        "autoscaling-max-missing",
        "none",
        _spec(autoscaling={"minReplicas": 1}),
        "spec.autoscaling.maxReplicas",
    ),
    Case("image-with-space", "none", _spec(images={"server": "registry/server: v1"}), "spec.images.server"),
    Case("unknown-spec-field", "none", _spec(replica=2), "spec.replica"),
    Case("unknown-nested-field", "none", _target(model={"url": "hf://a/b"}), "spec.target.model.url"),
    Case("snake-case-field", "none", _runtime(max_batch_size=64), "spec.runtime.max_batch_size"),
    Case(
        "explicit-null",
        "draftTarget",
        _runtime(crossKvCacheFraction=EXPLICIT_NULL),
        "spec.runtime.crossKvCacheFraction",
        server_side_apply_only=True,
    ),
    Case("name-not-dns-label", "none", {"metadata": {"name": "llama_70b"}}, "metadata.name"),
    Case("name-too-long", "none", {"metadata": {"name": "a" * 64}}, "metadata.name"),
]


def _node_requirement(**requirement: Any) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "zone", **requirement}]}
    required = {"nodeSelectorTerms": [term]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    return _spec(placement={"affinity": affinity})


_REQUIREMENT = (
    "spec.placement.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms[0].matchExpressions[0].values"
)

RULE_CASES = [
    Case(
        "toleration-exists-with-value",
        "none",
        _spec(placement={"tolerations": [{"key": "pool", "operator": "Exists", "value": "a"}]}),
        "spec.placement.tolerations[0].value",
        "toleration-exists-has-no-value",
    ),
    Case(
        "toleration-equal-without-key",
        "none",
        _spec(placement={"tolerations": [{"operator": "Equal", "value": "a"}]}),
        "spec.placement.tolerations[0].operator",
        "toleration-without-key-is-exists",
    ),
    Case(
        "toleration-seconds-without-noexecute",
        "none",
        _spec(placement={"tolerations": [{"key": "pool", "effect": "NoSchedule", "tolerationSeconds": 30}]}),
        "spec.placement.tolerations[0].tolerationSeconds",
        "toleration-seconds-need-noexecute",
    ),
    Case(
        "node-in-without-values",
        "none",
        _node_requirement(operator="In"),
        _REQUIREMENT,
        "node-selector-values-fit-operator",
    ),
    Case(
        "node-exists-with-values",
        "none",
        _node_requirement(operator="Exists", values=["a"]),
        _REQUIREMENT,
        "node-selector-values-fit-operator",
    ),
    Case(
        "node-gt-two-values",
        "none",
        _node_requirement(operator="Gt", values=["1", "2"]),
        _REQUIREMENT,
        "node-selector-values-fit-operator",
    ),
    Case("draft-missing", "draftTarget", _spec(draft=None), "spec.draft", "draft-required"),
    Case(
        "draft-with-prompt-lookup",
        "promptLookup",
        _spec(draft={"model": {"uri": "hf://meta-llama/Llama-3.2-1B-Instruct"}}),
        "spec.draft",
        "draft-forbidden",
    ),
    Case(
        "draft-with-method-none",
        "none",
        _spec(draft={"model": {"uri": "hf://meta-llama/Llama-3.2-1B-Instruct"}}),
        "spec.draft",
        "draft-forbidden",
    ),
    Case(
        "eagle3-on-tensorrt",
        "eagle3",
        {"spec": {"backend": "tensorrt", "runtime": {"maxSeqLen": None}}},
        "spec.speculative.method",
        "method-needs-pytorch",
    ),
    Case(
        "mtp-on-tensorrt",
        "none",
        _speculative(method="mtp"),
        "spec.speculative.method",
        "method-needs-pytorch",
    ),
    Case(
        "eagle3-on-transformers",
        "transformers",
        {
            "spec": {
                "draft": None,
                "speculative": {"method": "eagle3", "eagle": {"model": {"uri": "pvc://demo-models/eagle"}}},
            }
        },
        "spec.speculative.method",
        "method-needs-pytorch",
    ),
    Case(
        "mtp-on-transformers",
        "transformers",
        {"spec": {"draft": None, "speculative": {"method": "mtp"}}},
        "spec.speculative.method",
        "method-needs-pytorch",
    ),
    Case(
        "target-quantization-on-transformers",
        "transformers",
        _target(quantization={"format": "fp8"}),
        "spec.target.quantization",
        "target-quantization-not-for-transformers",
    ),
    Case(
        "draft-quantization-on-transformers",
        "transformers",
        _draft(quantization={"dtype": "float16"}),
        "spec.draft.quantization",
        "draft-quantization-not-for-transformers",
    ),
    Case(
        "target-build-on-transformers",
        "transformers",
        _build("target", maxBatchSize=8),
        "spec.target.build",
        "target-build-needs-tensorrt",
    ),
    Case(
        "draft-build-on-transformers",
        "transformers",
        _build("draft", maxSeqLen=2048),
        "spec.draft.build",
        "draft-build-needs-tensorrt",
    ),
    Case(
        "target-tensor-parallel-on-transformers",
        "transformers",
        _target(tensorParallel=2),
        "spec.target.tensorParallel",
        "target-single-device-for-transformers",
    ),
    Case(
        "draft-tensor-parallel-on-transformers",
        "transformers",
        {"spec": {"draft": {"tensorParallel": 2}, "placement": {"draft": "dedicated"}}},
        "spec.draft.tensorParallel",
        "draft-single-device-for-transformers",
    ),
    Case(
        "cpu-on-tensorrt",
        "none",
        _spec(placement={"device": "cpu"}),
        "spec.placement.device",
        "cpu-needs-transformers",
    ),
    Case(
        "cpu-on-pytorch",
        "eagle3",
        _spec(placement={"device": "cpu"}),
        "spec.placement.device",
        "cpu-needs-transformers",
    ),
    Case(
        "gpu-product-on-cpu",
        "transformers",
        _spec(placement={"gpuProduct": H100}),
        "spec.placement.gpuProduct",
        "gpu-product-not-on-cpu",
    ),
    Case(
        "kv-reuse-off-draft-target",
        "draftTarget",
        _runtime(enableKvCacheReuse=False),
        "spec.runtime.enableKvCacheReuse",
        "kv-cache-reuse-for-draft-tokens",
    ),
    Case(
        "kv-reuse-off-prompt-lookup",
        "promptLookup",
        _runtime(enableKvCacheReuse=False),
        "spec.runtime.enableKvCacheReuse",
        "kv-cache-reuse-for-draft-tokens",
    ),
    Case(
        "dedicated-without-draft",
        "promptLookup",
        _spec(placement={"draft": "dedicated"}),
        "spec.placement.draft",
        "dedicated-placement-needs-draft",
    ),
    Case(
        "colocated-draft-wider-than-target",
        "draftTarget",
        _draft(tensorParallel=4),
        "spec.draft.tensorParallel",
        "colocated-draft-fits",
    ),
    Case(
        "target-across-nodes-on-tensorrt",
        "none",
        _target(tensorParallel=16),
        "spec.backend",
        "multi-node-needs-pytorch",
    ),
    Case(
        "target-across-nodes-on-transformers",
        "transformers",
        _spec(placement={"device": "gpu", "gpusPerNode": 1, "draft": "dedicated"}),
        "spec.backend",
        "multi-node-needs-pytorch",
    ),
    Case(
        "target-leaves-gpus-of-a-node-unused",
        "eagle3",
        _target(tensorParallel=12),
        "spec.placement.gpusPerNode",
        "replica-takes-whole-nodes",
    ),
    Case(
        "dedicated-draft-across-nodes",
        "mtp",
        {
            "spec": {
                "speculative": {"method": "draftTarget", "draftLen": 3, "maxDraftLen": 3},
                "draft": {"model": {"uri": "hf://meta-llama/Llama-3.1-8B-Instruct"}, "tensorParallel": 8},
                "target": {"tensorParallel": 8},
                "placement": {"draft": "dedicated"},
            }
        },
        "spec.placement.draft",
        "multi-node-draft-colocated",
    ),
    Case(
        "dedicated-draft-overflows-node",
        "draftTarget",
        {
            "spec": {
                "target": {"tensorParallel": 4},
                "draft": {"tensorParallel": 8},
                "placement": {"draft": "dedicated"},
            }
        },
        "spec.placement.gpusPerNode",
        "replica-takes-whole-nodes",
    ),
    Case(
        "draft-kv-fraction-without-draft",
        "promptLookup",
        _runtime(draftKvCacheFreeGpuMemFraction=0.2),
        "spec.runtime.draftKvCacheFreeGpuMemFraction",
        "draft-kv-fraction-needs-draft",
    ),
    Case(
        "runtime-max-seq-len-on-tensorrt",
        "promptLookup",
        _runtime(maxSeqLen=4800),
        "spec.runtime.maxSeqLen",
        "runtime-max-seq-len-needs-pytorch",
    ),
    Case(
        "target-build-on-pytorch",
        "eagle3",
        _build("target", maxBatchSize=32),
        "spec.target.build",
        "target-build-needs-tensorrt",
    ),
    Case(
        "draft-build-on-pytorch",
        "draftTarget",
        {
            "spec": {
                "backend": "pytorch",
                "target": {"build": None, "quantization": None},
                "draft": {"quantization": None},
            }
        },
        "spec.draft.build",
        "draft-build-needs-tensorrt",
    ),
    Case(
        "target-pipeline-parallel",
        "draftTarget",
        _target(pipelineParallel=2),
        "spec.target.pipelineParallel",
        "target-pipeline-parallel-without-speculation",
    ),
    Case(
        "draft-pipeline-parallel",
        "draftTarget",
        _draft(tensorParallel=1, pipelineParallel=2),
        "spec.draft.pipelineParallel",
        "draft-pipeline-parallel-without-speculation",
    ),
    Case(
        "extra-args-max-draft-len",
        "draftTarget",
        _build("target", extraArgs=["--max_draft_len=4"]),
        "spec.target.build.extraArgs",
        "target-extra-args-derived-flags",
    ),
    Case(
        "extra-args-decoding-mode",
        "draftTarget",
        _build("draft", extraArgs=["--speculative_decoding_mode", "medusa"]),
        "spec.draft.build.extraArgs",
        "draft-extra-args-derived-flags",
    ),
    Case(
        "extra-args-abbreviated-flag",
        "draftTarget",
        _build("target", extraArgs=["--use_paged_context=disable"]),
        "spec.target.build.extraArgs",
        "target-extra-args-derived-flags",
    ),
    Case(
        "extra-args-workers",
        "promptLookup",
        _build("target", extraArgs=["--workers", "8"]),
        "spec.target.build.extraArgs",
        "target-extra-args-derived-flags",
    ),
    Case(
        "extra-args-context-logits",
        "draftTarget",
        _build("target", extraArgs=["--gather_context_logits"]),
        "spec.target.build.extraArgs",
        "target-extra-args-derived-flags",
    ),
    Case(
        "extra-args-output-dir",
        "draftTarget",
        _build("draft", extraArgs=["--output_dir=/tmp/engine"]),
        "spec.draft.build.extraArgs",
        "draft-extra-args-derived-flags",
    ),
    Case(
        "extra-args-modelled-batch-size",
        "draftTarget",
        _build("target", extraArgs=["--max_batch_size=64"]),
        "spec.target.build.extraArgs",
        "target-extra-args-modelled-flags",
    ),
    Case(
        "extra-args-modelled-gemm-plugin",
        "draftTarget",
        _build("draft", extraArgs=["--gemm_plugin", "auto"]),
        "spec.draft.build.extraArgs",
        "draft-extra-args-modelled-flags",
    ),
    Case(
        "input-longer-than-sequence",
        "promptLookup",
        _build("target", maxInputLen=8000),
        "spec.target.build.maxInputLen",
        "target-input-len-within-seq-len",
    ),
    Case(
        "draft-input-longer-than-sequence",
        "draftTarget",
        _build("draft", maxInputLen=130000),
        "spec.draft.build.maxInputLen",
        "draft-input-len-within-seq-len",
    ),
    Case(
        "swiglu-fp8-without-fp8",
        "draftTarget",
        _target(quantization={"format": "none", "kvCacheDtype": "auto"}),
        "spec.target.build",
        "target-fp8-plugins-need-fp8",
    ),
    Case(
        "low-latency-fp8-with-int8",
        "draftTarget",
        {
            "spec": {
                "draft": {
                    "quantization": {"format": "int8_sq"},
                    "build": {"gemmSwigluPlugin": None, "lowLatencyGemmPlugin": "fp8"},
                }
            }
        },
        "spec.draft.build",
        "draft-fp8-plugins-need-fp8",
    ),
    Case(
        "draft-len-above-max",
        "draftTarget",
        _speculative(draftLen=12),
        "spec.speculative.draftLen",
        "draft-len-within-max",
    ),
    Case(
        "logits-with-prompt-lookup",
        "promptLookup",
        _speculative(acceptance="logits"),
        "spec.speculative.acceptance",
        "logits-need-draft-target",
    ),
    Case(
        "logits-with-method-none",
        "none",
        _speculative(acceptance="logits"),
        "spec.speculative.acceptance",
        "logits-need-draft-target",
    ),
    Case(
        "logits-on-pytorch",
        "draftTarget",
        {
            "spec": {
                "backend": "pytorch",
                "target": {"build": None, "quantization": None},
                "draft": {"build": None, "quantization": None},
                "speculative": {"acceptance": "logits"},
            }
        },
        "spec.speculative.acceptance",
        "logits-not-on-pytorch",
    ),
    Case("eagle-missing", "eagle3", _speculative(eagle=None), "spec.speculative.eagle", "eagle-required"),
    Case(
        "eagle-with-draft-target",
        "draftTarget",
        _speculative(eagle={"model": {"uri": "hf://yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"}}),
        "spec.speculative.eagle",
        "eagle-only-for-eagle3",
    ),
    Case(
        "prompt-lookup-settings-with-none",
        "none",
        _speculative(promptLookup={"maxMatchingNgramSize": 3}),
        "spec.speculative.promptLookup",
        "prompt-lookup-only-for-prompt-lookup",
    ),
    Case(
        "two-chat-templates",
        "none",
        _spec(serving={"chatTemplate": "{{ messages }}", "chatTemplateConfigMap": {"name": "templates"}}),
        "spec.serving.chatTemplateConfigMap",
        "one-chat-template",
    ),
    Case(
        "env-named-twice",
        "none",
        _spec(serving={"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
        "spec.serving.env",
        "env-names-unique",
    ),
    Case(
        "env-sets-nccls",
        "none",
        _spec(serving={"env": [{"name": "NCCL_IB_DISABLE", "value": "0"}]}),
        "spec.serving.env",
        "env-not-the-operators",
    ),
    Case(
        "cache-claim-and-size",
        "none",
        _spec(engineCache={"pvcName": "engines", "size": "2Ti"}),
        "spec.engineCache.pvcName",
        "one-cache-source",
    ),
    Case("cache-empty", "none", _spec(engineCache={}), "spec.engineCache.pvcName", "one-cache-source"),
    Case(
        "cache-storage-class-with-claim",
        "none",
        _spec(engineCache={"pvcName": "engines", "storageClassName": "fast"}),
        "spec.engineCache.storageClassName",
        "storage-class-needs-size",
    ),
    Case(
        "rollout-cannot-progress",
        "none",
        _spec(rollout={"maxSurge": 0, "maxUnavailable": 0}),
        "spec.rollout.maxUnavailable",
        "rollout-can-progress",
    ),
    Case(
        "rollout-cannot-progress-percent",
        "none",
        _spec(rollout={"maxSurge": "0%", "maxUnavailable": 0}),
        "spec.rollout.maxUnavailable",
        "rollout-can-progress",
    ),
    Case(
        "autoscaling-min-above-max",
        "none",
        _spec(autoscaling={"minReplicas": 5, "maxReplicas": 2}),
        "spec.autoscaling.minReplicas",
        "autoscaling-min-within-max",
    ),
    Case(
        "autoscaling-zero-with-hpa",
        "none",
        _spec(autoscaling={"minReplicas": 0, "maxReplicas": 2}),
        "spec.autoscaling.minReplicas",
        "autoscaling-zero-needs-keda",
    ),
    Case(
        "autoscaling-keda-settings-with-hpa",
        "none",
        _spec(autoscaling={"maxReplicas": 2, "keda": {"pollingIntervalSeconds": 5}}),
        "spec.autoscaling.keda",
        "autoscaling-keda-settings-need-keda",
    ),
]

INVALID_CASES = SCHEMA_CASES + RULE_CASES
