"""`specdeploy-quantize`, the checkpoint step of build Jobs on the maintained path, run for real on a tiny
checkpoint: NVIDIA ModelOpt calibrates it on CPU and exports the Hugging Face checkpoint with
`hf_quant_config.json` that TensorRT-LLM's LLM API loads; bad arguments are refused naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from safetensors import safe_open
from specdeploy_server import quantize

from tests.server.conftest import TinyModels


def _calibration(tmp_path: Path) -> Path:
    texts = tmp_path / "calib.txt"
    texts.write_text("\n".join(f"speculative decoding sample {i} draft target" for i in range(8)) + "\n")
    return texts


@pytest.mark.parametrize(
    ("qformat", "kv", "quant_algo", "kv_algo"),
    [("fp8", "fp8", "FP8", "FP8"), ("fp8", "auto", "FP8", None)],
    ids=["fp8-weights-and-kv", "fp8-weights"],
)
def test_a_checkpoint_is_calibrated_and_exported_for_the_llm_api(
    *,
    tiny_models: TinyModels,
    tmp_path: Path,
    qformat: str,
    kv: str,
    quant_algo: str | None,
    kv_algo: str | None,
) -> None:
    out = tmp_path / "quantized"
    argv = [
        "--model_dir", str(tiny_models.target), "--output_dir", str(out), "--qformat", qformat,
        "--kv_cache_dtype", kv, "--calib_size", "4", "--calib_dataset", str(_calibration(tmp_path)),
    ]  # fmt: skip
    assert quantize.main(argv) == 0
    described = json.loads((out / "hf_quant_config.json").read_text())["quantization"]
    assert described["quant_algo"] == quant_algo
    assert described["kv_cache_quant_algo"] == kv_algo
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (out / "tokenizer.json").is_file() or (out / "tokenizer_config.json").is_file()
    [weights] = out.glob("*.safetensors")
    with safe_open(str(weights), "pt") as tensors:
        names = set(tensors.keys())
    if quant_algo == "FP8":  # the FP8 weights carry their scales
        assert any(name.endswith("weight_scale") for name in names)
        fp8 = next(name for name in names if name.endswith("q_proj.weight"))
        with safe_open(str(weights), "pt") as tensors:
            assert "float8" in str(tensors.get_tensor(fp8).dtype)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (["--kv_cache_dtype", "int8"], "--kv_cache_dtype int8"),
        (["--qformat", "none", "--kv_cache_dtype", "fp8"], "--qformat none: nothing to quantize"),
        (["--qformat", "fp4"], "invalid choice: 'fp4'"),
        (["--calib_size", "0"], "--calib_size must be at least 1"),
    ],
)
def test_bad_arguments_are_refused_naming_the_flag(
    tiny_models: TinyModels,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: list[str],
    message: str,
) -> None:
    argv = ["--model_dir", str(tiny_models.target), "--output_dir", str(tmp_path / "out"), *change]
    with pytest.raises(SystemExit) as exited:
        quantize.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_a_directory_that_is_no_checkpoint_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert quantize.main(["--model_dir", str(tmp_path), "--output_dir", str(tmp_path / "out")]) == 1
    assert "no config.json" in capsys.readouterr().err


def test_an_empty_calibration_file_is_an_error_not_a_crash(
    tiny_models: TinyModels, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text("\n")
    argv = ["--model_dir", str(tiny_models.target), "--output_dir", str(tmp_path / "out")]
    assert quantize.main([*argv, "--calib_dataset", str(empty)]) == 1
    assert "no calibration text" in capsys.readouterr().err
