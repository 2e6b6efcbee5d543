"""Manifests the schema alone refuses: types, enums, patterns, bounds, required fields."""

from __future__ import annotations

from tests.unit.api_cases.cases import (
    EXPLICIT_NULL,
    Case,
    patch_build,
    patch_draft,
    patch_runtime,
    patch_spec,
    patch_speculative,
    patch_target,
)

SCHEMA_CASES = [
    Case("replicas-negative", "none", patch_spec(replicas=-1), "spec.replicas"),
    Case("replicas-string", "none", patch_spec(replicas="2"), "spec.replicas"),
    Case("backend-unknown", "none", patch_spec(backend="onnx"), "spec.backend"),
    Case(
        "env-name-with-equals",
        "none",
        patch_spec(serving={"env": [{"name": "A=B"}]}),
        "spec.serving.env[0].name",
    ),
    Case("method-unknown", "none", patch_speculative(method="medusa"), "spec.speculative.method"),
    Case("method-missing", "none", patch_speculative(method=None), "spec.speculative.method"),
    Case("speculative-missing", "none", patch_spec(speculative=None), "spec.speculative"),
    Case("target-missing", "none", patch_spec(target=None), "spec.target"),
    Case("target-uri-missing", "none", patch_target(model={"uri": None}), "spec.target.model.uri"),
    Case(
        "target-uri-http",
        "none",
        patch_target(model={"uri": "http://example.com/m"}),
        "spec.target.model.uri",
    ),
    Case(
        "target-uri-hf-no-name",
        "none",
        patch_target(model={"uri": "hf://meta-llama"}),
        "spec.target.model.uri",
    ),
    Case(
        "draft-uri-ftp", "draftTarget", patch_draft(model={"uri": "ftp://host/model"}), "spec.draft.model.uri"
    ),
    Case(
        "eagle-uri-unknown-scheme",
        "eagle3",
        patch_speculative(eagle={"model": {"uri": "file:///models/eagle3"}}),
        "spec.speculative.eagle.model.uri",
    ),
    Case(
        "credentials-secret-bad-name",
        "none",
        patch_target(model={"credentialsSecret": "My_Token"}),
        "spec.target.model.credentialsSecret",
    ),
    Case("target-tp-zero", "none", patch_target(tensorParallel=0), "spec.target.tensorParallel"),
    Case("target-tp-too-large", "none", patch_target(tensorParallel=65), "spec.target.tensorParallel"),
    Case(
        "quantization-format-unknown",
        "none",
        patch_target(quantization={"format": "fp4"}),
        "spec.target.quantization.format",
    ),
    Case(
        "kv-cache-dtype-unknown",
        "draftTarget",
        patch_draft(quantization={"kvCacheDtype": "fp16"}),
        "spec.draft.quantization.kvCacheDtype",
    ),
    Case(
        "calib-size-zero",
        "none",
        patch_target(quantization={"calibSize": 0}),
        "spec.target.quantization.calibSize",
    ),
    Case(
        "dtype-float32",
        "none",
        patch_target(quantization={"dtype": "float32"}),
        "spec.target.quantization.dtype",
    ),
    Case(
        "gemm-plugin-unknown",
        "draftTarget",
        patch_build("target", gemmPlugin="fp16"),
        "spec.target.build.gemmPlugin",
    ),
    Case(
        "fused-mlp-boolean",
        "draftTarget",
        patch_build("target", useFusedMlp=True),
        "spec.target.build.useFusedMlp",
    ),
    Case(
        "swiglu-plugin-float16",
        "draftTarget",
        patch_build("draft", gemmSwigluPlugin="float16"),
        "spec.draft.build.gemmSwigluPlugin",
    ),
    Case(
        "max-batch-size-zero",
        "draftTarget",
        patch_build("target", maxBatchSize=0),
        "spec.target.build.maxBatchSize",
    ),
    Case(
        "extra-args-whitespace",
        "draftTarget",
        patch_build("target", extraArgs=["--log_level info"]),
        "spec.target.build.extraArgs[0]",
    ),
    Case(
        "model-name-with-a-space",
        "none",
        {"spec": {"serving": {"modelName": "llama 8b"}}},
        "spec.serving.modelName",
    ),
    Case(
        "extra-args-too-many",
        "draftTarget",
        patch_build("target", extraArgs=["--log_level=info"] * 65),
        "spec.target.build.extraArgs",
    ),
    Case("draft-len-zero", "draftTarget", patch_speculative(draftLen=0), "spec.speculative.draftLen"),
    Case(
        "draft-len-65",
        "draftTarget",
        patch_speculative(draftLen=65, maxDraftLen=64),
        "spec.speculative.draftLen",
    ),
    Case(
        "draft-len-unknown-word",
        "draftTarget",
        patch_speculative(draftLen="fast"),
        "spec.speculative.draftLen",
    ),
    Case(
        "disable-above-concurrency-zero",
        "draftTarget",
        patch_speculative(disableAboveConcurrency=0),
        "spec.speculative.disableAboveConcurrency",
    ),
    Case(
        "max-draft-len-65", "draftTarget", patch_speculative(maxDraftLen=65), "spec.speculative.maxDraftLen"
    ),
    Case(
        "acceptance-unknown",
        "draftTarget",
        patch_speculative(acceptance="sampling"),
        "spec.speculative.acceptance",
    ),
    Case(
        "ngram-size-zero",
        "promptLookup",
        patch_speculative(promptLookup={"maxMatchingNgramSize": 0}),
        "spec.speculative.promptLookup.maxMatchingNgramSize",
    ),
    Case(
        "placement-unknown", "draftTarget", patch_spec(placement={"draft": "shared"}), "spec.placement.draft"
    ),
    Case(
        "gpu-product-with-space",
        "none",
        patch_spec(placement={"gpuProduct": "NVIDIA H100"}),
        "spec.placement.gpuProduct",
    ),
    Case("device-unknown", "transformers", patch_spec(placement={"device": "tpu"}), "spec.placement.device"),
    Case(
        "gpus-per-node-zero", "none", patch_spec(placement={"gpusPerNode": 0}), "spec.placement.gpusPerNode"
    ),
    Case(
        "toleration-operator-unknown",
        "none",
        patch_spec(placement={"tolerations": [{"key": "nvidia.com/gpu", "operator": "Matches"}]}),
        "spec.placement.tolerations[0].operator",
    ),
    Case(
        "node-affinity-operator-unknown",
        "none",
        patch_spec(
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
        patch_spec(placement={"nodeSelector": {"pool": 5}}),
        "spec.placement.nodeSelector",
    ),
    Case(
        "node-selector-value-not-a-label-value",
        "none",
        patch_spec(placement={"nodeSelector": {"pool": "not a label value!"}}),
        "spec.placement.nodeSelector.pool",
    ),
    Case(
        "kv-fraction-zero",
        "none",
        patch_runtime(kvCacheFreeGpuMemFraction=0),
        "spec.runtime.kvCacheFreeGpuMemFraction",
    ),
    Case(
        "draft-kv-fraction-above-one",
        "draftTarget",
        patch_runtime(draftKvCacheFreeGpuMemFraction=1.5),
        "spec.runtime.draftKvCacheFreeGpuMemFraction",
    ),
    Case(
        "cross-kv-fraction-negative",
        "none",
        patch_runtime(crossKvCacheFraction=-0.1),
        "spec.runtime.crossKvCacheFraction",
    ),
    Case(
        "kv-reuse-string",
        "draftTarget",
        patch_runtime(enableKvCacheReuse="yes"),
        "spec.runtime.enableKvCacheReuse",
    ),
    Case(
        "offload-priority-above-100",
        "none",
        patch_runtime(secondaryOffloadMinPriority=101),
        "spec.runtime.secondaryOffloadMinPriority",
    ),
    Case(
        "runtime-max-seq-len-one",
        "transformers",
        patch_runtime(maxSeqLen=1),
        "spec.runtime.maxSeqLen",
    ),
    Case("port-zero", "none", patch_spec(serving={"port": 0}), "spec.serving.port"),
    Case("port-too-large", "none", patch_spec(serving={"port": 70000}), "spec.serving.port"),
    Case(
        "cpu-not-a-quantity",
        "draftTarget",
        patch_spec(serving={"resources": {"requests": {"cpu": "lots"}}}),
        "spec.serving.resources.requests.cpu",
    ),
    Case(
        "server-gpu-resources",
        "none",
        patch_spec(serving={"resources": {"limits": {"nvidia.com/gpu": 1}}}),
        "spec.serving.resources.limits.nvidia.com/gpu",
    ),
    Case(
        "cache-size-not-a-quantity", "none", patch_spec(engineCache={"size": "big"}), "spec.engineCache.size"
    ),
    Case("max-surge-150-percent", "none", patch_spec(rollout={"maxSurge": "150%"}), "spec.rollout.maxSurge"),
    Case(
        "max-unavailable-negative",
        "none",
        patch_spec(rollout={"maxUnavailable": -1}),
        "spec.rollout.maxUnavailable",
    ),
    Case(
        "autoscaling-metric-unknown",
        "none",
        patch_spec(autoscaling={"maxReplicas": 4, "metric": "gpuUtilization"}),
        "spec.autoscaling.metric",
    ),
    Case(
        "autoscaling-engine-unknown",
        "none",
        patch_spec(autoscaling={"maxReplicas": 4, "engine": "vpa"}),
        "spec.autoscaling.engine",
    ),
    Case(
        "autoscaling-scale-down-window-too-long",
        "none",
        patch_spec(autoscaling={"maxReplicas": 4, "scaleDown": {"stabilizationWindowSeconds": 7200}}),
        "spec.autoscaling.scaleDown.stabilizationWindowSeconds",
    ),
    Case(
        "autoscaling-target-not-positive",
        "none",
        patch_spec(autoscaling={"maxReplicas": 4, "target": 0}),
        "spec.autoscaling.target",
    ),
    Case(
        "autoscaling-keda-address-not-url",
        "none",
        patch_spec(
            autoscaling={"maxReplicas": 4, "engine": "keda", "keda": {"serverAddress": "prometheus:9090"}}
        ),
        "spec.autoscaling.keda.serverAddress",
    ),
    Case(
        "serving-grace-too-short",
        "none",
        patch_spec(serving={"terminationGracePeriodSeconds": 1}),
        "spec.serving.terminationGracePeriodSeconds",
    ),
    Case(
        "autoscaling-max-missing",
        "none",
        patch_spec(autoscaling={"minReplicas": 1}),
        "spec.autoscaling.maxReplicas",
    ),
    Case(
        "image-with-space", "none", patch_spec(images={"server": "registry/server: v1"}), "spec.images.server"
    ),
    Case("unknown-spec-field", "none", patch_spec(replica=2), "spec.replica"),
    Case("unknown-nested-field", "none", patch_target(model={"url": "hf://a/b"}), "spec.target.model.url"),
    Case("snake-case-field", "none", patch_runtime(max_batch_size=64), "spec.runtime.max_batch_size"),
    Case(
        "explicit-null",
        "draftTarget",
        patch_runtime(crossKvCacheFraction=EXPLICIT_NULL),
        "spec.runtime.crossKvCacheFraction",
        server_side_apply_only=True,
    ),
    Case("name-not-dns-label", "none", {"metadata": {"name": "llama_70b"}}, "metadata.name"),
    Case("name-too-long", "none", {"metadata": {"name": "a" * 64}}, "metadata.name"),
]
