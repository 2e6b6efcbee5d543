"""Manifests a rule of the maintained path's methods refuses: each method's settings, and the first
TensorRT-LLM release each method needs."""

from __future__ import annotations

from tests.unit.api_cases.cases import Case, patch_spec, patch_speculative

_DFLASH = {"model": {"uri": "hf://z-lab/LLaMA3.1-8B-Instruct-DFlash-UltraChat"}}
_OLD_IMAGE = {"server": "registry.example/trtllm:1.3.0rc14", "trtllmVersion": "1.3.0rc14"}

METHOD_CASES = [
    Case(
        "int8-kv-cache-on-pytorch",
        "pard",
        {"spec": {"target": {"quantization": {"format": "fp8", "kvCacheDtype": "int8"}}}},
        "spec.target.quantization.kvCacheDtype",
        "target-kv-cache-quantization-on-pytorch",
    ),
    Case(
        "fp8-kv-cache-without-weights-on-pytorch",
        "pard",
        {"spec": {"target": {"quantization": {"kvCacheDtype": "fp8"}}}},
        "spec.target.quantization.kvCacheDtype",
        "target-kv-cache-quantization-on-pytorch",
    ),
    Case(
        "int8-kv-cache-of-a-pytorch-draft",
        "mtp",
        {
            "spec": {
                "speculative": {"method": "draftTarget", "draftLen": 3, "maxDraftLen": 3},
                "draft": {
                    "model": {"uri": "hf://meta-llama/Llama-3.2-1B-Instruct"},
                    "quantization": {"kvCacheDtype": "int8"},
                },
            }
        },
        "spec.draft.quantization.kvCacheDtype",
        "draft-kv-cache-quantization-on-pytorch",
    ),
    Case(
        "pard-without-settings",
        "pard",
        patch_speculative(pard=None, suffixAutomaton=None),
        "spec.speculative.pard",
        "pard-required",
    ),
    Case(
        "pard-settings-on-eagle3",
        "eagle3",
        patch_speculative(pard={"model": {"uri": "hf://amd/PARD-Llama-3.2-1B"}}),
        "spec.speculative.pard",
        "pard-only-for-pard",
    ),
    Case(
        "dflash-without-settings",
        "pard",
        patch_speculative(method="dflash", pard=None, suffixAutomaton=None),
        "spec.speculative.dflash",
        "dflash-required",
    ),
    Case(
        "dflash-settings-on-pard",
        "pard",
        patch_speculative(dflash=_DFLASH),
        "spec.speculative.dflash",
        "dflash-only-for-dflash",
    ),
    Case(
        "ngram-settings-on-suffix-automaton",
        "suffixAutomaton",
        patch_speculative(ngram={"maxMatchingNgramSize": 3}),
        "spec.speculative.ngram",
        "ngram-only-for-ngram",
    ),
    Case(
        "suffix-automaton-on-draft-target",
        "draftTarget",
        patch_speculative(suffixAutomaton={"threshold": 4}),
        "spec.speculative.suffixAutomaton",
        "suffix-automaton-methods",
    ),
    Case(
        "suffix-automaton-threshold-alone",
        "suffixAutomaton",
        patch_speculative(suffixAutomaton={"threshold": 4}),
        "spec.speculative.suffixAutomaton",
        "suffix-automaton-fields-fit-the-method",
    ),
    Case(
        "suffix-automaton-ngram-size-with-pard",
        "pard",
        patch_speculative(suffixAutomaton={"maxMatchingNgramSize": 4}),
        "spec.speculative.suffixAutomaton",
        "suffix-automaton-fields-fit-the-method",
    ),
    Case(
        "suffix-automaton-pool-size-without-pool",
        "suffixAutomaton",
        patch_speculative(suffixAutomaton={"globalPool": False}),
        "spec.speculative.suffixAutomaton.globalPoolSize",
        "suffix-automaton-pool-size-needs-global-pool",
    ),
    Case(
        "suffix-automaton-pool-smaller-than-the-batch",
        "suffixAutomaton",
        patch_speculative(suffixAutomaton={"globalPoolSize": 100}),
        "spec.speculative.suffixAutomaton.globalPoolSize",
        "suffix-automaton-pool-holds-the-batch",
    ),
    Case(
        "suffix-automaton-pool-smaller-than-the-default-batch",
        "suffixAutomaton",
        {"spec": {"runtime": None, "speculative": {"suffixAutomaton": {"globalPoolSize": 32}}}},
        "spec.speculative.suffixAutomaton.globalPoolSize",
        "suffix-automaton-pool-holds-the-batch",
    ),
    Case(
        "ngram-on-tensorrt-release",
        "suffixAutomaton",
        {
            "spec": {
                "speculative": {"method": "ngram", "suffixAutomaton": None},
                "images": {"trtllmVersion": "0.21.0"},
            }
        },
        "spec.speculative.method",
        "ngram-needs-release",
    ),
    Case(
        "pard-before-its-release",
        "pard",
        patch_spec(images={"trtllmVersion": "1.3.0rc6"}, speculative={"suffixAutomaton": None}),
        "spec.speculative.method",
        "pard-needs-release",
    ),
    Case(
        "suffix-automaton-before-its-release",
        "suffixAutomaton",
        patch_spec(images={"trtllmVersion": "1.3.0rc9"}),
        "spec.speculative.method",
        "suffixautomaton-needs-release",
    ),
    Case(
        "dflash-before-its-release",
        "pard",
        patch_spec(
            images=_OLD_IMAGE,
            speculative={"method": "dflash", "pard": None, "suffixAutomaton": None, "dflash": _DFLASH},
        ),
        "spec.speculative.method",
        "dflash-needs-release",
    ),
    Case(
        "suffix-automaton-enhancer-before-its-release",
        "pard",
        patch_spec(images=_OLD_IMAGE),
        "spec.speculative.method",
        "suffix-automaton-enhancer-needs-release",
    ),
]
