"""Start-up checks of engine directories (config.json written in trtllm-build's layout): one rule per test
case, each failing case named by the field it must mention; no TensorRT-LLM needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from specdeploy_server.backends.engine_config import EngineConfigError, check_engines
from specdeploy_server.backends.errors import BackendUnavailableError
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig

from tests.server.conftest import TinyModels
from tests.server.trtllm_double import DoubleState, write_engine


def _config(
    tmp_path: Path,
    models: TinyModels,
    *,
    target: dict[str, Any] | None = None,
    draft: dict[str, Any] | None = None,
    with_draft: bool = True,
    **sections: Any,
) -> dict[str, Any]:
    state = DoubleState()
    model: dict[str, Any] = {
        "target": str(write_engine(tmp_path / "target", models.target, state, **(target or {})))
    }
    if with_draft:
        draft_args = {"speculative_decoding_mode": 1, **(draft or {})}
        model["draft"] = str(write_engine(tmp_path / "draft", models.draft_unrelated, state, **draft_args))
    return {"model": model, "backend": "trtllm-engine", **sections}


def test_well_built_engines_pass_and_set_the_limits(tmp_path: Path, tiny_models: TinyModels) -> None:
    config = _config(
        tmp_path,
        tiny_models,
        target={"max_input_len": 100, "max_seq_len": 256, "max_batch_size": 8},
        draft={"max_input_len": 150, "max_seq_len": 120},
        speculative={"draftLen": 5},
    )
    setup = check_engines(ServerConfig.model_validate(config))
    assert setup.max_model_len == 101  # the target's max_input_len + 1: every step re-sends the prefix
    assert setup.max_batch_size == 8
    assert setup.max_draft_len == 10


@pytest.mark.parametrize(
    ("target", "draft", "sections", "expected"),
    [
        ({}, {"vocab_size": 999}, {}, "pretrained_config.vocab_size 999 differs"),
        ({"speculative_decoding_mode": 1}, {}, {}, "speculative_decoding_mode is none"),
        ({"max_draft_len": 3}, {}, {"speculative": {"draftLen": 4}}, "max_draft_len 3 is below"),
        ({"use_paged_context_fmha": False}, {}, {}, "target engine"),
        ({}, {"use_paged_context_fmha": False}, {}, "draft engine"),
        ({"tp_size": 2}, {}, {}, "placement.targetDeviceIds lists 1"),
        ({}, {}, {"placement": {"draftDeviceIds": [0, 1]}}, "placement.draftDeviceIds lists 2"),
        (
            {},
            {"gather_generation_logits": True},
            {"speculative": {"acceptance": "logits"}},
            "gather_generation_logits is off",
        ),
        ({"max_seq_len": 128}, {}, {"model": {"maxModelLen": 200}}, "model.maxModelLen 200 exceeds"),
        ({}, {}, {"runtime": {"enableKvCacheReuse": False}}, "runtime.enableKvCacheReuse is false"),
    ],
    ids=[
        "vocabulary",
        "speculative-mode",
        "max-draft-len",
        "target-paged-fmha",
        "draft-paged-fmha",
        "target-tp",
        "draft-tp",
        "generation-logits",
        "max-seq-len",
        "kv-reuse",
    ],
)
def test_each_mismatch_is_one_clear_message(
    *,
    tmp_path: Path,
    tiny_models: TinyModels,
    target: dict[str, Any],
    draft: dict[str, Any],
    sections: dict[str, Any],
    expected: str,
) -> None:
    config = _config(tmp_path, tiny_models, target=target, draft=draft)
    for key, value in sections.items():
        config[key] = {**config.get(key, {}), **value}
    with pytest.raises(EngineConfigError) as info:
        check_engines(ServerConfig.model_validate(config))
    assert len(info.value.problems) == 1, info.value.problems
    assert expected in info.value.problems[0]


def test_all_failures_are_reported_together(tmp_path: Path, tiny_models: TinyModels) -> None:
    config = _config(
        tmp_path,
        tiny_models,
        target={"speculative_decoding_mode": 1, "use_paged_context_fmha": False},
        draft={"vocab_size": 7},
    )
    with pytest.raises(EngineConfigError) as info:
        check_engines(ServerConfig.model_validate(config))
    assert len(info.value.problems) == 3


def test_a_missing_rank_engine_is_reported(tmp_path: Path, tiny_models: TinyModels) -> None:
    config = _config(tmp_path, tiny_models, target={"tp_size": 2}, placement={"targetDeviceIds": [0, 1]})
    (Path(config["model"]["target"]) / "rank1.engine").unlink()
    with pytest.raises(EngineConfigError, match=r"2 but 1 rank\*\.engine files"):
        check_engines(ServerConfig.model_validate(config))


def test_plain_decoding_needs_no_speculative_build(tmp_path: Path, tiny_models: TinyModels) -> None:
    config = _config(
        tmp_path,
        tiny_models,
        with_draft=False,
        target={"speculative_decoding_mode": 1, "max_draft_len": 0, "use_paged_context_fmha": False},
        speculative={"method": "none"},
    )
    assert check_engines(ServerConfig.model_validate(config)).max_draft_len == 0


def test_prompt_lookup_needs_the_external_draft_tokens_build(tmp_path: Path, tiny_models: TinyModels) -> None:
    config = _config(
        tmp_path,
        tiny_models,
        with_draft=False,
        target={"speculative_decoding_mode": 1},
        speculative={"method": "promptLookup"},
    )
    with pytest.raises(EngineConfigError, match="draft_tokens_external"):
        check_engines(ServerConfig.model_validate(config))


def test_a_checkpoint_is_not_taken_for_an_engine(tmp_path: Path, tiny_models: TinyModels) -> None:
    config = {"model": {"target": str(tiny_models.target)}, "backend": "trtllm-engine"}
    with pytest.raises(EngineConfigError, match="no build_config/pretrained_config"):
        check_engines(ServerConfig.model_validate(config))


def test_engines_are_checked_before_tensorrt_llm_is_imported(tmp_path: Path, tiny_models: TinyModels) -> None:
    bad = _config(tmp_path, tiny_models, target={"speculative_decoding_mode": 1})
    with pytest.raises(EngineConfigError, match="speculative_decoding_mode"):
        build_engine(ServerConfig.model_validate(bad))


@pytest.mark.parametrize("method", ["eagle3", "mtp"])
def test_eagle3_and_mtp_are_refused_on_engines(tmp_path: Path, tiny_models: TinyModels, method: str) -> None:
    config = _config(tmp_path, tiny_models, with_draft=False, speculative={"method": method})
    if method == "eagle3":
        config["model"]["speculativeModel"] = str(tiny_models.draft_same)
    with pytest.raises(ValueError, match=r"runs (only )?on backend trtllm-llmapi"):
        ServerConfig.model_validate(config)
    config["backend"] = "auto"  # an engine directory resolves to trtllm-engine
    with pytest.raises(BackendUnavailableError, match=r"runs (only )?on backend trtllm-llmapi"):
        build_engine(ServerConfig.model_validate(config))
