"""Manifests a cross-field rule refuses: tolerations and node affinity, backends and methods, where the
models' GPUs go."""

from __future__ import annotations

from typing import Any

from tests.unit.api_cases.cases import (
    H100,
    Case,
    patch_build,
    patch_draft,
    patch_runtime,
    patch_spec,
    patch_target,
)


def _node_requirement(**requirement: Any) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "zone", **requirement}]}
    required = {"nodeSelectorTerms": [term]}
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}
    return patch_spec(placement={"affinity": affinity})


_REQUIREMENT = (
    "spec.placement.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    ".nodeSelectorTerms[0].matchExpressions[0].values"
)

PLACEMENT_AND_BACKEND_CASES = [
    Case(
        "toleration-exists-with-value",
        "none",
        patch_spec(placement={"tolerations": [{"key": "pool", "operator": "Exists", "value": "a"}]}),
        "spec.placement.tolerations[0].value",
        "toleration-exists-has-no-value",
    ),
    Case(
        "toleration-equal-without-key",
        "none",
        patch_spec(placement={"tolerations": [{"operator": "Equal", "value": "a"}]}),
        "spec.placement.tolerations[0].operator",
        "toleration-without-key-is-exists",
    ),
    Case(
        "toleration-seconds-without-noexecute",
        "none",
        patch_spec(
            placement={"tolerations": [{"key": "pool", "effect": "NoSchedule", "tolerationSeconds": 30}]}
        ),
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
    Case("draft-missing", "draftTarget", patch_spec(draft=None), "spec.draft", "draft-required"),
    Case(
        "draft-with-prompt-lookup",
        "promptLookup",
        patch_spec(draft={"model": {"uri": "hf://meta-llama/Llama-3.2-1B-Instruct"}}),
        "spec.draft",
        "draft-forbidden",
    ),
    Case(
        "draft-with-method-none",
        "none",
        patch_spec(draft={"model": {"uri": "hf://meta-llama/Llama-3.2-1B-Instruct"}}),
        "spec.draft",
        "draft-forbidden",
    ),
    Case(
        "eagle3-on-tensorrt",
        "eagle3",
        {"spec": {"backend": "tensorrt", "runtime": {"maxSeqLen": None}}},
        "spec.speculative.method",
        "eagle3-backends",
    ),
    Case(
        "mtp-on-tensorrt",
        "none",
        {"spec": {"backend": "tensorrt", "speculative": {"method": "mtp"}}},
        "spec.speculative.method",
        "method-needs-pytorch",
    ),
    Case(
        "suffix-automaton-over-eagle3-on-transformers",
        "transformers",
        {
            "spec": {
                "draft": None,
                "speculative": {
                    "method": "eagle3",
                    "eagle": {"model": {"uri": "pvc://demo-models/eagle"}},
                    "suffixAutomaton": {"threshold": 4},
                },
            }
        },
        "spec.speculative.suffixAutomaton",
        "suffix-automaton-on-pytorch",
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
        patch_target(quantization={"format": "fp8"}),
        "spec.target.quantization",
        "target-quantization-not-for-transformers",
    ),
    Case(
        "draft-quantization-on-transformers",
        "transformers",
        patch_draft(quantization={"dtype": "float16"}),
        "spec.draft.quantization",
        "draft-quantization-not-for-transformers",
    ),
    Case(
        "target-build-on-transformers",
        "transformers",
        patch_build("target", maxBatchSize=8),
        "spec.target.build",
        "target-build-needs-tensorrt",
    ),
    Case(
        "draft-build-on-transformers",
        "transformers",
        patch_build("draft", maxSeqLen=2048),
        "spec.draft.build",
        "draft-build-needs-tensorrt",
    ),
    Case(
        "target-tensor-parallel-on-transformers",
        "transformers",
        patch_target(tensorParallel=2),
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
        patch_spec(placement={"device": "cpu"}),
        "spec.placement.device",
        "cpu-needs-transformers",
    ),
    Case(
        "cpu-on-pytorch",
        "eagle3",
        patch_spec(placement={"device": "cpu"}),
        "spec.placement.device",
        "cpu-needs-transformers",
    ),
    Case(
        "gpu-product-on-cpu",
        "transformers",
        patch_spec(placement={"gpuProduct": H100}),
        "spec.placement.gpuProduct",
        "gpu-product-not-on-cpu",
    ),
    Case(
        "kv-reuse-off-draft-target",
        "draftTarget",
        patch_runtime(enableKvCacheReuse=False),
        "spec.runtime.enableKvCacheReuse",
        "kv-cache-reuse-for-draft-tokens",
    ),
    Case(
        "kv-reuse-off-prompt-lookup",
        "promptLookup",
        patch_runtime(enableKvCacheReuse=False),
        "spec.runtime.enableKvCacheReuse",
        "kv-cache-reuse-for-draft-tokens",
    ),
    Case(
        "dedicated-without-draft",
        "promptLookup",
        patch_spec(placement={"draft": "dedicated"}),
        "spec.placement.draft",
        "dedicated-placement-needs-draft",
    ),
    Case(
        "dedicated-draft-on-pytorch",
        "mtp",
        {
            "spec": {
                "speculative": {"method": "draftTarget", "draftLen": 3, "maxDraftLen": 3},
                "draft": {"model": {"uri": "hf://meta-llama/Llama-3.2-1B-Instruct"}, "tensorParallel": 1},
                "target": {"tensorParallel": 1},
                "placement": {"draft": "dedicated"},
            }
        },
        "spec.placement.draft",
        "dedicated-draft-not-on-pytorch",
    ),
    Case(
        "colocated-draft-wider-than-target",
        "draftTarget",
        patch_draft(tensorParallel=4),
        "spec.draft.tensorParallel",
        "colocated-draft-fits",
    ),
    Case(
        "target-across-nodes-on-tensorrt",
        "none",
        {"spec": {"backend": "tensorrt", "target": {"tensorParallel": 16}}},
        "spec.backend",
        "multi-node-needs-pytorch",
    ),
    Case(
        "target-across-nodes-on-transformers",
        "transformers",
        patch_spec(placement={"device": "gpu", "gpusPerNode": 1, "draft": "dedicated"}),
        "spec.backend",
        "multi-node-needs-pytorch",
    ),
    Case(
        "target-leaves-gpus-of-a-node-unused",
        "eagle3",
        patch_target(tensorParallel=12),
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
        patch_runtime(draftKvCacheFreeGpuMemFraction=0.2),
        "spec.runtime.draftKvCacheFreeGpuMemFraction",
        "draft-kv-fraction-needs-draft",
    ),
    Case(
        "runtime-max-seq-len-on-tensorrt",
        "promptLookup",
        patch_runtime(maxSeqLen=4800),
        "spec.runtime.maxSeqLen",
        "runtime-max-seq-len-needs-pytorch",
    ),
    Case(
        "target-build-on-pytorch",
        "eagle3",
        patch_build("target", maxBatchSize=32),
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
]
