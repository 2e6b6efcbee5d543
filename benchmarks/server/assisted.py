"""Benchmark 2: the reference backend against transformers' assisted generation, same CPU models and prompts.

Models: a random-weight Llama target whose layers after the first have their output projections scaled down
(they refine rather than overwrite the first layer's prediction, as in trained models where a shallow
"layer-skip" draft is useful), and a draft made of the target's embedding, first layer, final norm and LM
head.
Greedy decoding, one request at a time: transformers' assisted generation supports batch size 1 only.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from specdeploy_server import testing
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.types import SamplingParams
from specdeploy_server.testing import TinyLlama
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

LATER_LAYER_SCALE = 0.05
SHAPE = TinyLlama(
    hidden_size=256, layers=6, heads=8, kv_heads=4, intermediate_size=768, max_position_embeddings=1024
)


@dataclass(frozen=True)
class AssistedResult:
    method: str
    impl: str
    tok_s: float
    tokens_per_target_step: float
    acceptance: float | None
    identical: bool


def build_models(root: Path) -> tuple[Path, Path]:
    tok_dir = root / "tokenizer"
    tok_dir.mkdir()
    testing.train_tokenizer(tok_dir)
    target = testing.save_tiny_llama(root / "target", tok_dir, seed=0, shape=SHAPE)
    model: Any = AutoModelForCausalLM.from_pretrained(str(target), local_files_only=True)
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(LATER_LAYER_SCALE)
            layer.mlp.down_proj.weight.mul_(LATER_LAYER_SCALE)
    model.save_pretrained(str(target))
    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_hidden_layers = 1
    draft: Any = LlamaForCausalLM(config)
    draft.load_state_dict(model.state_dict(), strict=False)
    draft_dir = root / "draft"
    draft.save_pretrained(str(draft_dir))
    for item in tok_dir.iterdir():
        (draft_dir / item.name).write_bytes(item.read_bytes())
    return target, draft_dir


class _CallCounter:
    def __init__(self, model: Any) -> None:
        self.calls = 0
        model.register_forward_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.calls += 1


def _hf(
    target: Path, draft: Path, prompts: list[str], max_new: int, k: int
) -> dict[str, tuple[float, float, list[list[int]]]]:
    tok: Any = AutoTokenizer.from_pretrained(str(target), local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(str(target), local_files_only=True)
    model.eval()
    assistant: Any = AutoModelForCausalLM.from_pretrained(str(draft), local_files_only=True)
    assistant.eval()
    assistant.generation_config.num_assistant_tokens = k
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    counter = _CallCounter(model)
    out: dict[str, tuple[float, float, list[list[int]]]] = {}
    variants: dict[str, dict[str, Any]] = {
        "none": {},
        "draftTarget": {"assistant_model": assistant},
        "promptLookup": {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": 2},
    }
    for name, extra in variants.items():
        outputs: list[list[int]] = []
        tokens = calls = 0
        started = time.perf_counter()
        with torch.inference_mode():
            for prompt in prompts:
                ids = tok(prompt, return_tensors="pt").input_ids
                before = counter.calls
                gen = model.generate(ids, max_new_tokens=max_new, do_sample=False, **extra)
                calls += counter.calls - before
                new = gen[0, ids.shape[1] :].tolist()
                tokens += len(new)
                outputs.append(new)
        out[name] = (tokens / (time.perf_counter() - started), tokens / calls, outputs)
    return out


def _ours(
    target: Path, draft: Path, prompts: list[str], max_new: int, k: int
) -> dict[str, tuple[float, float, float | None, list[list[int]]]]:
    out: dict[str, tuple[float, float, float | None, list[list[int]]]] = {}
    for name in ("none", "draftTarget", "promptLookup"):
        config = {
            "model": {"target": str(target), "draft": str(draft)},
            "speculative": {"method": name, "draftLen": k},
            "placement": {"device": "cpu"},
        }

        async def main(config: dict[str, Any]) -> tuple[float, float, float | None, list[list[int]]]:
            engine = build_engine(ServerConfig.model_validate(config))
            await engine.start()
            outputs: list[list[int]] = []
            tokens = 0
            started = time.perf_counter()
            for prompt in prompts:
                gen = engine.generate(
                    engine.tokenizer.encode(prompt), max_new, SamplingParams(temperature=0.0)
                )
                new = [t async for o in gen.outputs for t in o.token_ids]
                tokens += len(new)
                outputs.append(new)
            elapsed = time.perf_counter() - started
            stats = engine.stats
            await engine.stop(5)
            acc = stats.accepted / stats.drafted if stats.drafted else None
            return tokens / elapsed, stats.emitted / stats.sequence_steps, acc, outputs

        out[name] = asyncio.run(main(config))
    return out


def run(prompts: int = 8, max_new: int = 64, k: int = 4) -> list[AssistedResult]:
    torch.set_num_threads(1)
    texts = testing.prompts(prompts, seed=11)
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = build_models(Path(tmp))
        hf = _hf(target, draft, texts, max_new, k)
        ours = _ours(target, draft, texts, max_new, k)
    results = []
    reference = hf["none"][2]
    for name in ("none", "draftTarget", "promptLookup"):
        tok_s, per_step, outputs = hf[name]
        results.append(
            AssistedResult(name, "transformers generate()", tok_s, per_step, None, outputs == reference)
        )
        tok_s, per_step, acc, outputs = ours[name]
        results.append(
            AssistedResult(name, "specdeploy reference", tok_s, per_step, acc, outputs == reference)
        )
    return results


def table(results: list[AssistedResult]) -> str:
    lines = [
        "| method | implementation | tok/s | tokens per target step | acceptance | ours / transformers "
        "| output = plain greedy |",
        "|---|---|---:|---:|---:|---:|---|",
    ]
    hf = {r.method: r.tok_s for r in results if r.impl.startswith("transformers")}
    for r in results:
        ratio = f"{r.tok_s / hf[r.method]:.2f}" if r.impl.startswith("specdeploy") else ""
        acc = f"{r.acceptance:.2f}" if r.acceptance is not None else "n/a"
        lines.append(
            f"| {r.method} | {r.impl} | {r.tok_s:.1f} | {r.tokens_per_target_step:.2f} | {acc} | {ratio} "
            f"| {'yes' if r.identical else 'NO'} |"
        )
    return "\n".join(lines)
