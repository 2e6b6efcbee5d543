"""The reference backend on a GPU with Llama-shaped models of realistic size: speculation against none.

For a session lent a GPU (issue 21's last item); nothing in ``make test`` needs one (a test runs this module
on the CPU with a tiny shape, the same code path). Models are random weights (speed does not depend on them)
built as benchmark 2 builds its CPU models: a target whose layers after the first are scaled down, so a
layer-skip draft (its first ``draft_layers`` layers, embedding, norm and head) agrees with it often enough to
be worth drafting. The vocabulary is Llama 3's size, 128 256 tokens (``--vocab``; the project's trained
tokenizer padded, ``checkpoints.train_tokenizer``): the embedding, the LM head and the logits each step copies
to the host cost what a real model's do, a large part of a small model's step and of a draft's.

One engine per policy (k = 0: plain decoding; k = 4; auto) is built and started once; at each concurrency the
policies take turns for ``rounds`` windows each, the first after a warm-up (as benchmark 7 measures the
reference backend); a figure is the median of its policy's windows.

    python -m benchmarks.server.gpu_reference          # llama-1b shape on cuda, concurrency 1 and 8
    python -m benchmarks.server.gpu_reference --shape llama-8b --out /tmp/gpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_testkit import sample_text
from specdeploy_testkit.checkpoints import TinyLlama

from benchmarks.server import assisted
from benchmarks.server.load_sweep import take_turns

#: Llama 3.2 1B's and Llama 3.1 8B's layer shapes (the vocabulary is ``--vocab``'s)
SHAPES = {
    "llama-1b": TinyLlama(
        hidden_size=2048,
        layers=16,
        heads=32,
        kv_heads=8,
        intermediate_size=8192,
        max_position_embeddings=2048,
    ),
    "llama-8b": TinyLlama(
        hidden_size=4096,
        layers=32,
        heads=32,
        kv_heads=8,
        intermediate_size=14336,
        max_position_embeddings=2048,
    ),
    "tiny": assisted.SHAPE,  # the CPU smoke test's
}
POLICIES: tuple[int | None, ...] = (0, 4, None)  # k = 0 (no drafter), k = 4, auto
LLAMA3_VOCAB = 128_256
AUTO_CAP = 8  # maxDraftLen: the longest draft auto may choose


@dataclass(frozen=True)
class GpuPoint:
    device: str
    shape: str
    vocab: int
    concurrency: int
    policy: str
    tok_s: float  # median of the policy's windows
    windows_tok_s: list[float]
    tokens_per_step: float  # per sequence step, in the median window


def _config(target: Path, draft: Path, k: int | None, device: str, dtype: str) -> dict[str, Any]:
    speculative: dict[str, Any] = (
        {"method": "none"} if k == 0 else {"method": "draftTarget", "maxDraftLen": AUTO_CAP}
    )
    if k != 0:
        speculative["draftLen"] = "auto" if k is None else k
    return {
        "model": {"target": str(target), "draft": str(draft), "dtype": dtype},
        "speculative": speculative,
        "placement": {"device": device},
        "runtime": {"maxBatchSize": 16},
    }


async def _measure(target: Path, draft: Path, args: argparse.Namespace, device_name: str) -> list[GpuPoint]:
    """Every concurrency of ``args``, on one engine per policy built and started once (auto's controller
    carries what it learnt from one concurrency to the next, as in a server whose load changes)."""
    started = time.perf_counter()
    engines = {
        k: build_engine(ServerConfig.model_validate(_config(target, draft, k, args.device, args.dtype)))
        for k in POLICIES
    }
    print(f"{len(engines)} engines built in {time.perf_counter() - started:.1f} s", flush=True)
    prompts = [engines[0].tokenizer.encode(t) for t in sample_text.prompts(16, seed=11)]
    for engine in engines.values():
        await engine.start()
    points: list[GpuPoint] = []
    try:
        for level in args.concurrency:
            turns = await take_turns(
                engines,
                prompts,
                level,
                args.max_tokens,
                rounds=args.rounds,
                window_seconds=args.seconds,
                warmup_seconds=args.warmup,
                started_by_caller=True,
            )
            points += _points(turns, args, level, device_name)
    finally:
        for engine in engines.values():
            await engine.stop(0)
    return points


def _points(
    turns: dict[int | None, list[tuple[int, float, int, int, int]]],
    args: argparse.Namespace,
    level: int,
    device_name: str,
) -> list[GpuPoint]:
    windows = {
        k: [(tokens / seconds, tokens / steps if steps else 0.0) for tokens, seconds, steps, *_ in taken]
        for k, taken in turns.items()
    }
    points = []
    for k, measured in windows.items():
        median = statistics.median_high(rate for rate, _ in measured)
        per_step = next(per for rate, per in measured if rate == median)
        policy = "auto" if k is None else f"k={k}"
        rates = [r for r, _ in measured]
        points.append(GpuPoint(device_name, args.shape, args.vocab, level, policy, median, rates, per_step))
    return points


def device_name(device: str) -> str:
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here (use --device cpu --shape tiny for a smoke run)")
    return torch.cuda.get_device_name(0) if device == "cuda" else "cpu"


def build(root: Path, args: argparse.Namespace) -> tuple[Path, Path]:
    """The (target, draft) checkpoints ``args`` ask for, under ``root``."""
    started = time.perf_counter()
    models = assisted.build_models(
        root,
        SHAPES[args.shape],
        draft_layers=args.draft_layers,
        dtype=args.dtype,
        device=args.device,
        vocab_size=args.vocab,
    )
    print(f"{args.shape} models built in {time.perf_counter() - started:.1f} s", flush=True)
    return models


def run_on(target: Path, draft: Path, args: argparse.Namespace) -> list[GpuPoint]:
    return asyncio.run(_measure(target, draft, args, device_name(args.device)))


def run(args: argparse.Namespace) -> list[GpuPoint]:
    device_name(args.device)  # fails before minutes of building where there is no GPU
    with tempfile.TemporaryDirectory() as tmp:
        return run_on(*build(Path(tmp), args), args)


def table(points: list[GpuPoint]) -> str:
    lines = [
        f"Device: {points[0].device}; shape {points[0].shape} (random weights, {points[0].vocab}-token "
        "vocabulary).",
        "",
        "| concurrency | policy | tok/s (median) | vs k=0 | tokens per sequence step | windows tok/s |",
        "|---:|---|---:|---:|---:|---|",
    ]
    plain = {p.concurrency: p.tok_s for p in points if p.policy == "k=0"}
    for p in points:
        ratio = p.tok_s / plain[p.concurrency] if plain.get(p.concurrency) else float("nan")
        windows = " ".join(f"{w:.0f}" for w in p.windows_tok_s)
        figures = f"{p.tok_s:.0f} | {ratio:.2f} | {p.tokens_per_step:.2f}"
        lines.append(f"| {p.concurrency} | {p.policy} | {figures} | {windows} |")
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.server.gpu_reference", description=__doc__)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama-1b")
    parser.add_argument("--dtype", choices=("bfloat16", "float16", "float32"), default="bfloat16")
    parser.add_argument("--draft-layers", type=int, default=2, help="layers of the layer-skip draft")
    parser.add_argument("--vocab", type=int, default=LLAMA3_VOCAB, help="vocabulary size (default Llama 3's)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=3, help="windows per policy")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of a window")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before an engine's first window")
    parser.add_argument("--max-tokens", type=int, default=128, help="tokens per request")
    parser.add_argument("--out", type=Path, help="write the points as JSON here")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    points = run(args)
    print(table(points))
    if args.out is not None:
        args.out.write_text(json.dumps([dataclasses.asdict(p) for p in points], indent=1) + "\n")


if __name__ == "__main__":
    main()
