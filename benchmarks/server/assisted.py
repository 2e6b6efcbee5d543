"""Benchmark 2: the reference backend against transformers' assisted generation, same CPU models and prompts.

Models: a random-weight Llama target whose layers after the first have their output projections scaled down
(they refine rather than overwrite the first layer's prediction, as in trained models where a shallow
"layer-skip" draft is useful), and a draft made of the target's embedding, first layer, final norm and LM
head.
Greedy decoding, one request at a time: transformers' assisted generation supports batch size 1 only. Each
method runs transformers' and ours on the same prompts in turn, prompt by prompt, so both see the same load.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.types import SamplingParams
from specdeploy_testkit import checkpoints, sample_text
from specdeploy_testkit.checkpoints import TinyLlama
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


def build_models(
    root: Path,
    shape: TinyLlama = SHAPE,
    *,
    draft_layers: int = 1,
    dtype: str = "float32",
    device: str = "cpu",
    vocab_size: int | None = None,
) -> tuple[Path, Path]:
    """(target, draft) checkpoints under ``root``: a random-weight Llama of ``shape`` whose layers after the
    first are scaled down, and a draft made of its first ``draft_layers`` layers, embedding, norm and head
    (both saved in ``dtype``). Built on ``device`` (a model of billions of parameters initialises in seconds
    on a GPU, in minutes on a CPU). ``vocab_size``: the tokenizer is padded to that many tokens
    (``checkpoints.train_tokenizer``); else it has the 384 it is trained to."""
    tok_dir = root / "tokenizer"
    tok_dir.mkdir()
    checkpoints.train_tokenizer(tok_dir, padded_to=vocab_size)
    model: Any = checkpoints.tiny_llama(tok_dir, seed=0, shape=shape, device=device)
    with torch.no_grad():
        for layer in model.model.layers[1:]:
            layer.self_attn.o_proj.weight.mul_(LATER_LAYER_SCALE)
            layer.mlp.down_proj.weight.mul_(LATER_LAYER_SCALE)
    model.to(getattr(torch, dtype))
    target = checkpoints.save_with_tokenizer(model, root / "target", tok_dir)
    config = model.config.__class__.from_dict(model.config.to_dict())
    config.num_hidden_layers = draft_layers
    with torch.device(device):
        draft: Any = LlamaForCausalLM(config)
    draft.load_state_dict(model.state_dict(), strict=False)
    del model
    draft_dir = checkpoints.save_with_tokenizer(draft.to(getattr(torch, dtype)), root / "draft", tok_dir)
    return target, draft_dir


class _CallCounter:
    def __init__(self, model: Any) -> None:
        self.calls = 0
        model.register_forward_hook(self._hook)

    def _hook(self, *_: Any) -> None:
        self.calls += 1


class Transformers:
    """transformers' ``generate()`` on the target: plain, with the draft as assistant, with prompt lookup."""

    def __init__(
        self, target: Path, draft: Path, k: int, device: str = "cpu", dtype: str = "float32"
    ) -> None:
        self.tok: Any = AutoTokenizer.from_pretrained(str(target), local_files_only=True)
        self.device = device
        loaded = {"local_files_only": True, "dtype": getattr(torch, dtype)}
        model: Any = AutoModelForCausalLM.from_pretrained(str(target), **loaded)
        model.to(device).eval()
        self.model: Any = model
        assistant: Any = AutoModelForCausalLM.from_pretrained(str(draft), **loaded)
        assistant.to(device).eval()
        assistant.generation_config.num_assistant_tokens = k
        assistant.generation_config.num_assistant_tokens_schedule = "constant"
        self.counter = _CallCounter(self.model)
        self._reference: list[list[int]] | None = None
        self.variants: dict[str, dict[str, Any]] = {
            "none": {},
            "draftTarget": {"assistant_model": assistant},
            "promptLookup": {"prompt_lookup_num_tokens": k, "max_matching_ngram_size": 2},
        }

    def reference(self, prompts: list[str], max_new: int) -> list[list[int]]:
        """Plain greedy output, the reference every output is compared with."""
        if self._reference is None:
            self._reference = [self.generate("none", p, max_new)[2] for p in prompts]
        return self._reference

    def generate(self, method: str, prompt: str, max_new: int) -> tuple[float, int, list[int]]:
        """Seconds, target forward calls, new tokens."""
        with torch.inference_mode():
            ids = self.tok(prompt, return_tensors="pt").input_ids.to(self.device)
            before = self.counter.calls
            started = time.perf_counter()
            gen = self.model.generate(ids, max_new_tokens=max_new, do_sample=False, **self.variants[method])
            gen = gen.cpu()  # waits for the device
            seconds = time.perf_counter() - started
        return seconds, self.counter.calls - before, gen[0, ids.shape[1] :].tolist()


@dataclass
class _Tally:
    seconds: float = 0.0
    tokens: int = 0
    outputs: list[list[int]] = dataclasses.field(default_factory=list)

    def add(self, seconds: float, new: list[int]) -> None:
        self.seconds += seconds
        self.tokens += len(new)
        self.outputs.append(new)


def compare(
    hf: Transformers,
    target: Path,
    draft: Path,
    method: str,
    prompts: list[str],
    *,
    max_new: int,
    k: int,
    dtype: str = "float32",
    warmup_seconds: float = 0.0,
) -> list[AssistedResult]:
    """transformers' and ours on the same prompts, prompt by prompt in turn (the machine's load drifts), on
    ``hf``'s device, after each has generated for ``warmup_seconds`` (at least once)."""
    config = {
        "model": {"target": str(target), "draft": str(draft), "dtype": dtype},
        "speculative": {"method": method, "draftLen": k},
        "placement": {"device": hf.device},
    }

    async def main() -> list[AssistedResult]:
        engine = build_engine(ServerConfig.model_validate(config))
        await engine.start()

        async def ours(prompt: str, tokens: int) -> tuple[float, list[int]]:
            started = time.perf_counter()
            gen = engine.generate(engine.tokenizer.encode(prompt), tokens, SamplingParams(temperature=0.0))
            new = [t async for o in gen.outputs for t in o.token_ids]
            return time.perf_counter() - started, new

        warming = time.perf_counter()  # first-call allocations; on a GPU, an engine's first seconds
        while True:
            await ours(prompts[0], 4)
            hf.generate(method, prompts[0], 4)
            if time.perf_counter() - warming >= warmup_seconds:
                break
        before = dataclasses.replace(engine.stats)
        theirs, mine, calls = _Tally(), _Tally(), 0
        for prompt in prompts:
            seconds, forwards, new = hf.generate(method, prompt, max_new)
            theirs.add(seconds, new)
            calls += forwards
            mine.add(*await ours(prompt, max_new))
        stats = engine.stats
        await engine.stop(5)
        drafted, accepted = stats.drafted - before.drafted, stats.accepted - before.accepted
        steps = stats.sequence_steps - before.sequence_steps
        return [
            AssistedResult(
                method,
                "transformers generate()",
                theirs.tokens / theirs.seconds,
                theirs.tokens / calls,
                None,
                theirs.outputs == hf.reference(prompts, max_new),
            ),
            AssistedResult(
                method,
                "specdeploy reference",
                mine.tokens / mine.seconds,
                (stats.emitted - before.emitted) / steps,
                accepted / drafted if drafted else None,
                mine.outputs == hf.reference(prompts, max_new),
            ),
        ]

    return asyncio.run(main())


def run(prompts: int = 8, max_new: int = 64, k: int = 4) -> list[AssistedResult]:
    torch.set_num_threads(1)
    texts = sample_text.prompts(prompts, seed=11)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = build_models(Path(tmp))
        hf = Transformers(target, draft, k)
        for name in ("none", "draftTarget", "promptLookup"):
            results += compare(hf, target, draft, name, texts, max_new=max_new, k=k)
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
