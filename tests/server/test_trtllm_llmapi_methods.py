"""The maintained path's methods on backend trtllm-llmapi, through the TensorRT-LLM test double:
TensorRT-LLM's n-gram drafter, the suffix automaton alone and over a neural draft, PARD and DFlash. Each is
rendered into its real config class with that class's fields (trtllm_double_configs cites the source), keeps
greedy output exactly the target's, and fails at start-up, naming the class, where the installed release
lacks it."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import Method, ServerConfig
from specdeploy_server.core.types import SamplingParams
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.server.conftest import TinyModels
from tests.server.trtllm_double import DoubleState, trtllm_double
from tests.server.trtllm_double_configs import MODEL_ALIAS

__all__ = ["trtllm_double"]

DRAFT = "speculativeModel"

CASES: list[tuple[str, dict[str, Any], str | None, str, dict[str, Any]]] = [
    (
        "ngram",
        {"method": "ngram", "draftLen": 4, "ngram": {"maxMatchingNgramSize": 3, "publicPool": False}},
        None,
        "NGramDecodingConfig",
        {"max_draft_len": 4, "max_matching_ngram_size": 3, "is_public_pool": False, "is_keep_all": True},
    ),
    (
        "suffix-automaton",
        {"method": "suffixAutomaton", "draftLen": 5},
        None,
        "SADecodingConfig",
        {"max_draft_len": 5, "max_matching_ngram_size": -1, "enable_global_pool": False},
    ),
    (
        "suffix-automaton-global-pool",
        {
            "method": "suffixAutomaton",
            "draftLen": 3,
            "suffixAutomaton": {"maxMatchingNgramSize": 4, "globalPool": True, "globalPoolSize": 64},
        },
        None,
        "SADecodingConfig",
        {"max_matching_ngram_size": 4, "enable_global_pool": True, "global_pool_size": 64},
    ),
    (
        "pard",
        {"method": "pard", "draftLen": 4, "pard": {"maskTokenId": 7}},
        DRAFT,
        "PARDDecodingConfig",
        {"max_draft_len": 4, "mask_token_id": 7, "sa_config": None},
    ),
    (
        "dflash",
        {"method": "dflash", "draftLen": 6, "maxDraftLen": 6, "dflash": {"targetLayerIds": [0, 1]}},
        DRAFT,
        "DFlashDecodingConfig",
        {
            "max_draft_len": 6,
            "target_layer_ids": [0, 1],
            "mask_token_id": None,
            "attention_backend": "VANILLA",
        },
    ),
]
ENHANCED: list[tuple[str, dict[str, Any], str | None, str]] = [
    ("eagle3", {"method": "eagle3", "draftLen": 3}, DRAFT, "Eagle3DecodingConfig"),
    ("mtp", {"method": "mtp", "draftLen": 2}, None, "MTPDecodingConfig"),
    ("pard", {"method": "pard", "draftLen": 4}, DRAFT, "PARDDecodingConfig"),
]


def _config(models: TinyModels, speculative: dict[str, Any], extra_model: str | None) -> ServerConfig:
    model = {"target": str(models.target)}
    if extra_model is not None:
        model[extra_model] = str(models.draft_same)
    return ServerConfig.model_validate(
        {"model": model, "backend": "trtllm-llmapi", "speculative": speculative}
    )


@pytest.mark.parametrize(
    ("speculative", "extra_model", "kind", "fields"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_each_method_is_rendered_into_its_config_class(
    *,
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    speculative: dict[str, Any],
    extra_model: str | None,
    kind: str,
    fields: dict[str, Any],
) -> None:
    build_engine(_config(tiny_models, speculative, extra_model))
    (llm,) = trtllm_double.llms
    spec = llm.kwargs["speculative_config"]
    assert type(spec).__name__ == kind
    for key, value in fields.items():
        assert getattr(spec, key) == value, key
    if extra_model is not None:
        assert spec.speculative_model == str(tiny_models.draft_same)
    assert llm.kwargs["disable_overlap_scheduler"] is True


@pytest.mark.parametrize(
    ("speculative", "extra_model", "kind"), [case[1:] for case in ENHANCED], ids=[c[0] for c in ENHANCED]
)
def test_a_suffix_automaton_over_a_neural_draft_is_its_sa_config(
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    speculative: dict[str, Any],
    extra_model: str | None,
    kind: str,
) -> None:
    with_sa = {**speculative, "suffixAutomaton": {"threshold": 6, "globalPool": True}}
    build_engine(_config(tiny_models, with_sa, extra_model))
    spec = trtllm_double.llms[-1].kwargs["speculative_config"]
    assert type(spec).__name__ == kind
    assert type(spec.sa_config).__name__ == "SAEnhancerConfig"
    assert (spec.sa_config.threshold, spec.sa_config.enable_global_pool) == (6, True)
    build_engine(_config(tiny_models, {**speculative, "suffixAutomaton": {}}, extra_model))
    assert trtllm_double.llms[-1].kwargs["speculative_config"].sa_config.threshold == 4  # TensorRT-LLM's


def test_mtp_names_its_draft_length_both_ways(tiny_models: TinyModels, trtllm_double: DoubleState) -> None:
    build_engine(_config(tiny_models, {"method": "mtp", "draftLen": 3}, None))
    spec = trtllm_double.llms[-1].kwargs["speculative_config"]
    assert (spec.num_nextn_predict_layers, spec.max_draft_len) == (3, 3)


@pytest.mark.parametrize(
    ("speculative", "extra_model"),
    [(case[1], case[2]) for case in CASES]
    + [(c[1] | {"suffixAutomaton": {"threshold": 2}}, c[2]) for c in ENHANCED],
    ids=[case[0] for case in CASES] + [f"{c[0]}-with-sa" for c in ENHANCED],
)
def test_greedy_output_is_exactly_the_targets_with_every_method(
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    speculative: dict[str, Any],
    extra_model: str | None,
) -> None:
    tok: Any = AutoTokenizer.from_pretrained(str(tiny_models.target), local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(str(tiny_models.target), local_files_only=True)
    prompt = tok("the draft repeats the draft repeats the draft", return_tensors="pt").input_ids
    with torch.inference_mode():
        expected = model.generate(prompt, max_new_tokens=12, do_sample=False)[0, prompt.shape[1] :].tolist()
    engine = build_engine(_config(tiny_models, speculative, extra_model))

    async def main() -> list[int]:
        await engine.start()
        gen = engine.generate(prompt[0].tolist(), 12, SamplingParams(temperature=0.0))
        tokens = [t async for out in gen.outputs for t in out.token_ids]
        await engine.stop(1)
        return tokens

    assert asyncio.run(main()) == expected
    (request,) = trtllm_double.llms[-1].requests
    if extra_model is not None:  # the draft is the target's twin: its drafts are accepted
        assert request.accepted > 0


@pytest.mark.parametrize(
    ("method", "extra_model", "missing"),
    [
        ("suffixAutomaton", None, "SADecodingConfig"),
        ("pard", DRAFT, "PARDDecodingConfig"),
        ("dflash", DRAFT, "DFlashDecodingConfig"),
    ],
)
def test_a_release_without_the_methods_class_fails_at_start_up_naming_it(
    *,
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    monkeypatch: pytest.MonkeyPatch,
    method: str,
    extra_model: str | None,
    missing: str,
) -> None:
    monkeypatch.delattr(sys.modules["tensorrt_llm.llmapi"], missing)
    with pytest.raises(ValueError, match=f"speculative.method {method}: this TensorRT-LLM has no {missing}"):
        build_engine(_config(tiny_models, {"method": method, "draftLen": 3}, extra_model))


def test_sa_over_eagle3_needs_sa_enhancer_config(
    tiny_models: TinyModels, trtllm_double: DoubleState, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delattr(sys.modules["tensorrt_llm.llmapi"], "SAEnhancerConfig")
    config = _config(tiny_models, {"method": "eagle3", "draftLen": 3, "suffixAutomaton": {}}, DRAFT)
    with pytest.raises(ValueError, match="no SAEnhancerConfig"):
        build_engine(config)


def test_the_double_refuses_what_the_real_sa_validator_refuses(trtllm_double: DoubleState) -> None:
    llmapi = sys.modules["tensorrt_llm.llmapi"]
    with pytest.raises(ValueError, match="got 0"):
        llmapi.SADecodingConfig(max_draft_len=4, max_matching_ngram_size=0)
    with pytest.raises(ValueError, match="requires enable_global_pool"):
        llmapi.SADecodingConfig(max_draft_len=4, global_pool_size=8)
    with pytest.raises(ValueError, match="in \\[1, 64\\]"):
        llmapi.SADecodingConfig(max_draft_len=4, enable_global_pool=True, max_matching_ngram_size=65)
    with pytest.raises(ValueError, match="max_draft_len must be > 0"):
        llmapi.PARDDecodingConfig(speculative_model="x")
    with pytest.raises(ValueError, match="SAEnhancerConfig"):
        llmapi.Eagle3DecodingConfig(max_draft_len=3, speculative_model="x", sa_config={"threshold": 4})
    with pytest.raises(ValueError, match="attention_backend"):
        llmapi.DFlashDecodingConfig(max_draft_len=3, speculative_model="x", attention_backend="FA4")
    with pytest.raises(ValueError, match="Extra inputs"):
        llmapi.SAEnhancerConfig(threshold=4, max_matching_ngram_size=3)


def _mapping_rows() -> dict[str, str]:
    """docs/trtllm.md's method -> `speculative_config` table: the first cell's method names -> the row."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "trtllm.md").read_text()
    block = text[text.index("| method | `speculative_config` |") :].split("\n\n", 1)[0]
    rows: dict[str, str] = {}
    for line in block.splitlines()[2:]:
        first, _, rest = line.strip("|").partition("|")
        for method in re.findall(r"`(\w+)`", first):
            rows.setdefault(method, rest)
    return rows


MINIMAL: dict[str, tuple[dict[str, Any], str | None]] = {
    "draftTarget": ({"method": "draftTarget", "draftLen": 3}, "draft"),
    "promptLookup": ({"method": "promptLookup", "draftLen": 3}, None),
    "eagle3": ({"method": "eagle3", "draftLen": 3}, DRAFT),
    "mtp": ({"method": "mtp", "draftLen": 2}, None),
    "ngram": ({"method": "ngram", "draftLen": 3}, None),
    "suffixAutomaton": ({"method": "suffixAutomaton", "draftLen": 3}, None),
    "pard": ({"method": "pard", "draftLen": 3}, DRAFT),
    "dflash": ({"method": "dflash", "draftLen": 3}, DRAFT),
}


@pytest.mark.parametrize("method", [m.value for m in Method if m != Method.NONE])
def test_the_docs_mapping_table_row_names_the_class_and_fields_the_method_renders(
    tiny_models: TinyModels, trtllm_double: DoubleState, method: str
) -> None:
    row = _mapping_rows()[method]
    speculative, extra_model = MINIMAL[method]
    build_engine(_config(tiny_models, speculative, extra_model))
    spec = trtllm_double.llms[-1].kwargs["speculative_config"]
    kind = type(spec).__name__
    assert kind in re.findall(r"\w+DecodingConfig", row), (method, row)
    for field in _row_fields(row, kind):
        assert field in type(spec).model_fields or field in MODEL_ALIAS, (method, field)
    assert _mapping_rows()["none"].strip() == "none"


def _row_fields(row: str, kind: str) -> set[str]:
    """The keywords the row gives `kind`: in its parentheses, or in the next class's where the row names
    alternatives (`Eagle3DecodingConfig` / `EagleDecodingConfig(...)`)."""
    found = re.findall(r"(\w+DecodingConfig)(?:\(([^)]*)\))?", row)
    for index, (name, _) in enumerate(found):
        if name == kind:
            args = next((a for _, a in found[index:] if a), "")
            return {part.split("=")[0].strip() for part in args.split(",") if part.strip()}
    return set()


def test_a_concurrency_ceiling_beside_an_upper_bounds_schedule_goes_into_the_schedule(
    tiny_models: TinyModels, trtllm_double: DoubleState, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From 1.3 TensorRT-LLM refuses `max_concurrency` beside `draft_len_schedule` and wants the smallest key
    to map to `max_draft_len`: the ceiling is cut into the schedule instead."""
    monkeypatch.setattr(sys.modules["tensorrt_llm"], "__version__", "1.3.0rc27")
    speculative = {
        "method": "suffixAutomaton",
        "draftLen": "auto",
        "maxDraftLen": 6,
        "disableAboveConcurrency": 3,
    }
    build_engine(_config(tiny_models, speculative, None))
    spec = trtllm_double.llms[-1].kwargs["speculative_config"]
    assert spec.max_concurrency is None
    assert spec.draft_len_schedule[min(spec.draft_len_schedule)] == 6
    assert max(spec.draft_len_schedule) <= 3  # off above 3 requests
    llmapi = sys.modules["tensorrt_llm.llmapi"]
    with pytest.raises(ValueError, match="mutually exclusive"):
        llmapi.SADecodingConfig(max_draft_len=4, max_concurrency=3, draft_len_schedule={1: 4})
    with pytest.raises(ValueError, match=r"draft_len_schedule\[2\] must equal max_draft_len"):
        llmapi.SADecodingConfig(max_draft_len=4, draft_len_schedule={2: 3, 8: 1})
