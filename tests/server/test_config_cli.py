"""The server configuration contract and the command line."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from specdeploy_server.cli import GC_GEN0_THRESHOLD, freeze_startup_heap, load_config, main
from specdeploy_server.config import Backend, Method, ServerConfig, detect_backend


def test_a_yaml_file_with_camel_case_keys_is_read_and_flags_override_it(tmp_path: Path) -> None:
    path = tmp_path / "server.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "model": {
                    "target": "/models/llama-70b",
                    "draft": "/models/llama-8b",
                    "servedModelName": "llama",
                },
                "speculative": {"draftLen": 6, "maxDraftLen": 10, "acceptance": "logits"},
                "runtime": {"maxBatchSize": 32, "kvCacheFreeGpuMemFraction": 0.6},
                "placement": {"targetDeviceIds": [0, 1], "draftDeviceIds": [0, 1]},
            }
        )
    )
    config = load_config(["--config", str(path), "--port", "9000", "--draft-len", "auto", "--debug"])
    assert config.model.name == "llama"
    assert config.method == Method.DRAFT_TARGET
    assert config.speculative.draft_len == "auto"
    assert config.runtime.max_batch_size == 32
    assert config.runtime.kv_cache_free_gpu_mem_fraction == 0.6
    assert config.placement.target_device_ids == [0, 1]
    assert config.serving.port == 9000
    assert config.logging.level == "DEBUG"


def test_the_seed_launch_shape_sets_target_draft_port_and_debug() -> None:
    config = load_config(["/engines/target", "/engines/draft", "--port", "8123", "--debug"])
    assert config.model.target == Path("/engines/target")
    assert config.model.draft == Path("/engines/draft")
    assert config.model.name == "target"
    assert config.serving.port == 8123
    assert config.method == Method.DRAFT_TARGET


def test_aliases_come_from_the_file_or_from_repeated_flags() -> None:
    config = load_config(["/m/llama", "--served-model-alias", "short", "--served-model-alias", "gpt-4o"])
    assert config.model.names == ("llama", "short", "gpt-4o")


def test_without_a_draft_the_method_defaults_to_plain_decoding() -> None:
    assert load_config(["/m/t"]).method == Method.NONE
    assert load_config(["/m/t", "--speculative-method", "promptLookup"]).method == Method.PROMPT_LOOKUP


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"model": {"target": "/t"}, "speculative": {"draftLne": 3}}, "draftLne"),
        ({"model": {"target": "/t"}, "speculative": {"draftLen": 12}}, "exceeds maxDraftLen"),
        ({"model": {"target": "/t"}, "speculative": {"method": "draftTarget"}}, "needs model.draft"),
        (
            {"model": {"target": "/t"}, "runtime": {"kvCacheFreeGpuMemFraction": 1.5}},
            "kvCacheFreeGpuMemFraction",
        ),
        ({"model": {"target": "/t", "servedModelAliases": ["t"]}}, "servedModelAliases"),
        ({"model": {"target": "/t", "servedModelAliases": ["a", "a"]}}, "servedModelAliases"),
        ({"model": {"target": "/t", "servedModelName": "a b"}}, "servedModelName"),
    ],
)
def test_invalid_configurations_are_rejected_with_the_field_named(
    data: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        ServerConfig.model_validate(data)


def test_the_dumped_configuration_reads_back_identically() -> None:
    config = load_config(["/m/t", "/m/d", "--max-matching-ngram-size", "3", "--use-logits"])
    again = ServerConfig.model_validate(json.loads(json.dumps(config.dump())))
    assert again == config
    assert config.dump()["speculative"]["promptLookup"]["maxMatchingNgramSize"] == 3
    assert config.dump()["speculative"]["acceptance"] == "logits"


def test_an_engine_directory_selects_the_tensorrt_backend(tmp_path: Path) -> None:
    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "config.json").write_text("{}")
    (engine / "rank0.engine").write_bytes(b"")
    checkpoint = tmp_path / "hf"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    assert detect_backend(engine) == Backend.TRTLLM_ENGINE
    assert detect_backend(checkpoint) == Backend.PYTORCH_REFERENCE


def test_help_and_print_config(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "--draft-len" in capsys.readouterr().out
    main(["/m/target", "--print-config"])
    printed = json.loads(capsys.readouterr().out)
    assert printed["model"]["target"] == "/m/target"
    assert printed["speculative"]["draftLen"] == 4


def test_an_invalid_configuration_exits_with_status_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["/m/t", "--draft-len", "99"])
    assert info.value.code == 2
    assert "exceeds maxDraftLen" in capsys.readouterr().err


def test_the_request_body_limit_comes_from_the_file_or_the_flag(tmp_path: Path) -> None:
    path = tmp_path / "server.json"
    path.write_text(json.dumps({"model": {"target": "/m"}, "serving": {"maxRequestBodyBytes": 4096}}))
    assert load_config(["--config", str(path)]).serving.max_request_body_bytes == 4096
    flagged = load_config(["--config", str(path), "--max-request-body-bytes", "1024"])
    assert flagged.serving.max_request_body_bytes == 1024
    assert load_config(["/m"]).serving.max_request_body_bytes == 16 * 1024 * 1024
    with pytest.raises(ValidationError, match="maxRequestBodyBytes"):
        load_config(["/m", "--max-request-body-bytes", "0"])


def test_what_is_alive_once_the_models_are_loaded_is_frozen_out_of_the_collectors_reach() -> None:
    gc.unfreeze()
    thresholds = gc.get_threshold()
    try:
        freeze_startup_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (GC_GEN0_THRESHOLD, *thresholds[1:])
    finally:
        gc.unfreeze()
        gc.set_threshold(*thresholds)
