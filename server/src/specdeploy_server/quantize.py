"""`specdeploy-quantize`: the checkpoint step of a build Job on TensorRT-LLM's maintained path. It quantizes a
Hugging Face checkpoint with NVIDIA ModelOpt (post-training quantization, calibrated on text) and exports a
Hugging Face checkpoint with ModelOpt's `hf_quant_config.json`, which `tensorrt_llm.LLM` loads directly.

TensorRT-LLM's `examples/quantization/quantize.py` wrote a TensorRT-LLM checkpoint for `trtllm-build`, and
left the release images in July 2026; ModelOpt's `examples/llm_ptq/hf_ptq.py` is what NVIDIA's docs now run,
and is not in any image. The arguments keep `quantize.py`'s names. ModelOpt is imported only when quantizing
(the release image carries it; `pip install nvidia-modelopt` elsewhere); it runs on CPU for small models."""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("specdeploy.quantize")

#: --qformat -> ModelOpt's quantization config
FORMATS = {
    "fp8": "FP8_DEFAULT_CFG",
    "int8_sq": "INT8_SMOOTHQUANT_CFG",
    "int4_awq": "INT4_AWQ_CFG",
    "w4a8_awq": "W4A8_AWQ_BETA_CFG",
    "nvfp4": "NVFP4_DEFAULT_CFG",
}
#: --kv_cache_dtype -> ModelOpt's KV-cache config (TensorRT-LLM's PyTorch path reads FP8 KV scales)
KV_FORMATS = {"fp8": "FP8_KV_CFG"}
DTYPES = ("auto", "float16", "bfloat16")
DEFAULT_DATASET = "cnn_dailymail"
"""The calibration set of TensorRT-LLM's quantize.py and ModelOpt's hf_ptq.py (from the Hugging Face hub)."""


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specdeploy-quantize", description=__doc__.splitlines()[0])
    parser.add_argument("--model_dir", type=Path, required=True, help="Hugging Face checkpoint to quantize")
    parser.add_argument("--output_dir", type=Path, required=True, help="where the quantized checkpoint goes")
    parser.add_argument("--qformat", choices=["none", *FORMATS], default="fp8", help="weight format")
    parser.add_argument("--kv_cache_dtype", choices=["auto", "fp8", "int8"], default="auto")
    parser.add_argument("--dtype", choices=DTYPES, default="auto", help="dtype of what stays unquantized")
    parser.add_argument("--calib_size", type=int, default=512, help="calibration samples")
    parser.add_argument("--calib_max_seq_length", type=int, default=512, help="tokens per sample, at most")
    parser.add_argument(
        "--calib_dataset",
        default=DEFAULT_DATASET,
        help=f"a text file (one sample per line) or a .jsonl file (a 'text' field), else a hub dataset "
        f"(default {DEFAULT_DATASET}: needs egress to huggingface.co)",
    )
    args = parser.parse_args(argv)
    if args.calib_size < 1:
        parser.error(f"--calib_size must be at least 1, got {args.calib_size}")
    if args.kv_cache_dtype == "int8":
        parser.error("--kv_cache_dtype int8: TensorRT-LLM's PyTorch path reads FP8 KV-cache scales only")
    if args.qformat == "none":
        parser.error(
            "--qformat none: nothing to quantize "
            "(ModelOpt exports KV-cache scales with quantized weights only)"
        )
    return args


def calibration_texts(source: str, count: int) -> list[str]:
    """`count` samples (or all there are) from a local file or a hub dataset."""
    path = Path(source)
    if path.is_file():
        lines = path.read_text(encoding="utf-8").splitlines()
        if path.suffix == ".jsonl":
            texts = [str(json.loads(line)["text"]) for line in lines if line.strip()]
        else:
            texts = [line for line in lines if line.strip()]
    else:
        texts = list(_hub_texts(source, count))
    if not texts:
        raise ValueError(f"--calib_dataset {source}: no calibration text")
    return texts[:count]


def _hub_texts(name: str, count: int) -> Iterator[str]:
    from datasets import load_dataset  # noqa: PLC0415 - in the release image; only for hub datasets

    if name == DEFAULT_DATASET:
        rows = load_dataset("cnn_dailymail", "3.0.0", split="train", streaming=True)
        key = "article"
    else:
        rows = load_dataset(name, split="train", streaming=True)
        key = "text"
    for index, row in enumerate(rows):
        if index >= count:
            return
        yield str(row[key])


def quant_config(mtq: Any, qformat: str, kv_cache_dtype: str) -> dict[str, Any]:
    """ModelOpt's config for the weight format plus the KV-cache one; `quant_cfg` is a dict in older ModelOpt
    releases and a list of rules in newer ones."""
    parts = [getattr(mtq, FORMATS[qformat])]
    if kv_cache_dtype in KV_FORMATS:
        parts.append(getattr(mtq, KV_FORMATS[kv_cache_dtype]))
    merged: dict[str, Any] = {}
    for part in parts:
        rules = part["quant_cfg"]
        if isinstance(rules, dict):
            merged["quant_cfg"] = {**merged.get("quant_cfg", {}), **rules}
        else:
            merged["quant_cfg"] = [*merged.get("quant_cfg", []), *rules]
        if "algorithm" in part and "algorithm" not in merged:
            merged["algorithm"] = part["algorithm"]
    return merged


def quantize(args: argparse.Namespace) -> None:
    import modelopt.torch.quantization as mtq  # noqa: PLC0415 - heavy; the release image has it
    import torch  # noqa: PLC0415
    from modelopt.torch.export import export_hf_checkpoint  # noqa: PLC0415
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    if not (args.model_dir / "config.json").is_file():
        raise ValueError(f"--model_dir {args.model_dir}: no config.json (not a Hugging Face checkpoint)")
    cuda = torch.cuda.is_available()
    dtype = "auto" if args.dtype == "auto" else getattr(torch, args.dtype)
    tokenizer: Any = AutoTokenizer.from_pretrained(args.model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(
        args.model_dir, torch_dtype=dtype, device_map="auto" if cuda else None
    )
    model.eval()
    texts = calibration_texts(args.calib_dataset, args.calib_size)
    device = next(model.parameters()).device
    log.info("calibrating on %d samples of %s (%s)", len(texts), args.calib_dataset, device)

    def forward_loop(m: Any) -> None:
        with torch.inference_mode():
            for text in texts:
                ids = tokenizer(
                    text, return_tensors="pt", truncation=True, max_length=args.calib_max_seq_length
                ).input_ids
                m(ids.to(device))

    model = mtq.quantize(model, quant_config(mtq, args.qformat, args.kv_cache_dtype), forward_loop)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    export_hf_checkpoint(model, export_dir=args.output_dir)
    tokenizer.save_pretrained(args.output_dir)
    generation = args.model_dir / "generation_config.json"
    if generation.is_file() and not (args.output_dir / "generation_config.json").is_file():
        shutil.copy(generation, args.output_dir)
    log.info("wrote %s", args.output_dir)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    try:
        quantize(args)
    except (OSError, ValueError) as exc:
        print(f"specdeploy-quantize: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
