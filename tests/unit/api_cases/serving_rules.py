"""Manifests a cross-field rule refuses: build arguments, lengths, logits, serving, rollout, autoscaling."""

from __future__ import annotations

from tests.unit.api_cases.cases import (
    Case,
    patch_build,
    patch_draft,
    patch_spec,
    patch_speculative,
    patch_target,
)

BUILD_AND_SERVING_CASES = [
    Case(
        "target-pipeline-parallel",
        "draftTarget",
        patch_target(pipelineParallel=2),
        "spec.target.pipelineParallel",
        "target-pipeline-parallel-without-speculation",
    ),
    Case(
        "draft-pipeline-parallel",
        "draftTarget",
        patch_draft(tensorParallel=1, pipelineParallel=2),
        "spec.draft.pipelineParallel",
        "draft-pipeline-parallel-without-speculation",
    ),
    Case(
        "extra-args-max-draft-len",
        "draftTarget",
        patch_build("target", extraArgs=["--max_draft_len=4"]),
        "spec.target.build.extraArgs",
        "target-extra-args-derived-flags",
    ),
    Case(
        "extra-args-decoding-mode",
        "draftTarget",
        patch_build("draft", extraArgs=["--speculative_decoding_mode", "medusa"]),
        "spec.draft.build.extraArgs",
        "draft-extra-args-derived-flags",
    ),
    Case(
        "extra-args-abbreviated-flag",
        "draftTarget",
        patch_build("target", extraArgs=["--use_paged_context=disable"]),
        "spec.target.build.extraArgs",
        "target-extra-args-derived-flags",
    ),
    Case(
        "extra-args-workers",
        "promptLookup",
        patch_build("target", extraArgs=["--workers", "8"]),
        "spec.target.build.extraArgs",
        "target-extra-args-derived-flags",
    ),
    Case(
        "extra-args-context-logits",
        "draftTarget",
        patch_build("target", extraArgs=["--gather_context_logits"]),
        "spec.target.build.extraArgs",
        "target-extra-args-derived-flags",
    ),
    Case(
        "extra-args-output-dir",
        "draftTarget",
        patch_build("draft", extraArgs=["--output_dir=/tmp/engine"]),
        "spec.draft.build.extraArgs",
        "draft-extra-args-derived-flags",
    ),
    Case(
        "extra-args-modelled-batch-size",
        "draftTarget",
        patch_build("target", extraArgs=["--max_batch_size=64"]),
        "spec.target.build.extraArgs",
        "target-extra-args-modelled-flags",
    ),
    Case(
        "extra-args-modelled-gemm-plugin",
        "draftTarget",
        patch_build("draft", extraArgs=["--gemm_plugin", "auto"]),
        "spec.draft.build.extraArgs",
        "draft-extra-args-modelled-flags",
    ),
    Case(
        "input-longer-than-sequence",
        "promptLookup",
        patch_build("target", maxInputLen=8000),
        "spec.target.build.maxInputLen",
        "target-input-len-within-seq-len",
    ),
    Case(
        "draft-input-longer-than-sequence",
        "draftTarget",
        patch_build("draft", maxInputLen=130000),
        "spec.draft.build.maxInputLen",
        "draft-input-len-within-seq-len",
    ),
    Case(
        "swiglu-fp8-without-fp8",
        "draftTarget",
        patch_target(quantization={"format": "none", "kvCacheDtype": "auto"}),
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
        patch_speculative(draftLen=12),
        "spec.speculative.draftLen",
        "draft-len-within-max",
    ),
    Case(
        "logits-with-prompt-lookup",
        "promptLookup",
        patch_speculative(acceptance="logits"),
        "spec.speculative.acceptance",
        "logits-need-draft-target",
    ),
    Case(
        "logits-with-eagle3-on-pytorch",
        "eagle3",
        patch_speculative(acceptance="logits"),
        "spec.speculative.acceptance",
        "logits-not-on-pytorch",
    ),
    Case(
        "logits-with-method-none",
        "none",
        patch_speculative(acceptance="logits"),
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
    Case(
        "eagle-missing", "eagle3", patch_speculative(eagle=None), "spec.speculative.eagle", "eagle-required"
    ),
    Case(
        "eagle-with-draft-target",
        "draftTarget",
        patch_speculative(eagle={"model": {"uri": "hf://yuhuili/EAGLE3-LLaMA3.3-Instruct-70B"}}),
        "spec.speculative.eagle",
        "eagle-only-for-eagle3",
    ),
    Case(
        "prompt-lookup-settings-with-none",
        "none",
        patch_speculative(promptLookup={"maxMatchingNgramSize": 3}),
        "spec.speculative.promptLookup",
        "prompt-lookup-only-for-prompt-lookup",
    ),
    Case(
        "two-chat-templates",
        "none",
        patch_spec(
            serving={"chatTemplate": "{{ messages }}", "chatTemplateConfigMap": {"name": "templates"}}
        ),
        "spec.serving.chatTemplateConfigMap",
        "one-chat-template",
    ),
    Case(
        "env-named-twice",
        "none",
        patch_spec(serving={"env": [{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]}),
        "spec.serving.env",
        "env-names-unique",
    ),
    Case(
        "alias-named-twice",
        "none",
        patch_spec(serving={"modelAliases": ["llama", "llama"]}),
        "spec.serving.modelAliases",
        "model-aliases-distinct",
    ),
    Case(
        "alias-is-the-model-name",
        "none",
        patch_spec(serving={"modelName": "llama", "modelAliases": ["short", "llama"]}),
        "spec.serving.modelAliases",
        "model-aliases-distinct",
    ),
    Case(
        "env-sets-nccls",
        "none",
        patch_spec(serving={"env": [{"name": "NCCL_IB_DISABLE", "value": "0"}]}),
        "spec.serving.env",
        "env-not-the-operators",
    ),
    Case(
        "cache-claim-and-size",
        "none",
        patch_spec(engineCache={"pvcName": "engines", "size": "2Ti"}),
        "spec.engineCache.pvcName",
        "one-cache-source",
    ),
    Case("cache-empty", "none", patch_spec(engineCache={}), "spec.engineCache.pvcName", "one-cache-source"),
    Case(
        "cache-storage-class-with-claim",
        "none",
        patch_spec(engineCache={"pvcName": "engines", "storageClassName": "fast"}),
        "spec.engineCache.storageClassName",
        "storage-class-needs-size",
    ),
    Case(
        "rollout-cannot-progress",
        "none",
        patch_spec(rollout={"maxSurge": 0, "maxUnavailable": 0}),
        "spec.rollout.maxUnavailable",
        "rollout-can-progress",
    ),
    Case(
        "rollout-cannot-progress-percent",
        "none",
        patch_spec(rollout={"maxSurge": "0%", "maxUnavailable": 0}),
        "spec.rollout.maxUnavailable",
        "rollout-can-progress",
    ),
    Case(
        "autoscaling-min-above-max",
        "none",
        patch_spec(autoscaling={"minReplicas": 5, "maxReplicas": 2}),
        "spec.autoscaling.minReplicas",
        "autoscaling-min-within-max",
    ),
    Case(
        "autoscaling-zero-with-hpa",
        "none",
        patch_spec(autoscaling={"minReplicas": 0, "maxReplicas": 2}),
        "spec.autoscaling.minReplicas",
        "autoscaling-zero-needs-keda",
    ),
    Case(
        "autoscaling-keda-settings-with-hpa",
        "none",
        patch_spec(autoscaling={"maxReplicas": 2, "keda": {"pollingIntervalSeconds": 5}}),
        "spec.autoscaling.keda",
        "autoscaling-keda-settings-need-keda",
    ),
]
