"""The demo's models: a tiny Llama target trained locally in seconds, and a draft cut from it.

``python -m specdeploy_server.demo_models OUT_DIR [--seconds S] [--steps N] [--seed N]`` writes two Hugging
Face checkpoints, ``OUT_DIR/target`` and ``OUT_DIR/draft``, and prints a one-line JSON summary.

Nothing is downloaded. The text is ``demo_corpus.txt``, shipped with this package (prose written for the
project about speculative decoding, serving and Kubernetes, plus a few question/answer pairs that the chat
template reproduces). A byte-level BPE tokenizer is trained on it, then a small Llama is trained on it for a
fixed number of steps on one CPU thread. They are NOT real language models: they know this text and little
else, and they mostly recite it. That is enough for the demo to print readable text and a meaningful
acceptance rate.

The draft is the target's first layer(s) with its own final norm and LM head: during training an "early
exit" after those layers is trained alongside the full model (on the data and to imitate the full model's
next-token distribution), so the cut-down model agrees with the target most of the time. Both share the
tokenizer and vocabulary.

Determinism: the same ``--seed`` and the same step count give byte-identical checkpoints (one thread, fixed
data order). ``--seconds`` is a nominal budget turned into a step count by a constant calibrated on a small
2-core machine, never by the clock, so it stays deterministic; the time actually taken is reported.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.resources
import json
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaForCausalLM, PreTrainedTokenizerFast

from specdeploy_server.demo_training import (
    DemoShape,
    EarlyExit,
    TrainSettings,
    draft_from,
    llama_config,
    train,
)

__all__ = [
    "CHAT_TEMPLATE",
    "SAMPLE_PROMPTS",
    "DemoResult",
    "DemoShape",
    "TrainSettings",
    "bpe_tokenizer",
    "build",
    "corpus_text",
    "documents",
    "main",
    "measure_acceptance",
    "token_stream",
]

CORPUS_RESOURCE = "demo_corpus.txt"

BOS, EOS, PAD = "<s>", "</s>", "<pad>"

CHAT_TEMPLATE = (
    "{% for m in messages %}"
    "{% if m['role'] == 'user' %}Question: {{ m['content'] }}\n"
    "{% elif m['role'] == 'assistant' %}Answer: {{ m['content'] }}{{ eos_token }}"
    "{% else %}{{ m['content'] }}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}Answer:{% endif %}"
)
"""Renders a conversation the way the corpus writes its question/answer pairs: chat answers are readable."""

STEPS_PER_SECOND = 6.0
"""Training steps per second on one thread of the 2-core development machine (measured, rounded down):
``--seconds`` is turned into ``round(seconds * STEPS_PER_SECOND)`` steps."""

DEFAULT_SECONDS = 40.0

DEFAULT_SHAPE = DemoShape()

SAMPLE_PROMPTS = (
    "Speculative decoding makes",
    "A readiness probe tells Kubernetes",
    "An operator is a controller that",
    "When a pod is deleted,",
    "Question: What is the acceptance rate?\nAnswer:",
    "Question: What is a service?\nAnswer:",
    "The weather today is",
    "My favourite colour is",
)
"""Prompts the acceptance rate is measured on: openings of sentences of the corpus, a question it answers, and
a question and two openings it has never seen (where the tiny models agree less)."""


@dataclass(frozen=True)
class DemoResult:
    target: Path
    draft: Path
    steps: int
    train_seconds: float
    train_cpu_seconds: float
    target_loss: float
    draft_loss: float
    target_parameters: int
    draft_parameters: int


def corpus_text() -> str:
    """The English text the demo models learn (package data)."""
    return (importlib.resources.files("specdeploy_server") / CORPUS_RESOURCE).read_text(encoding="utf-8")


def documents(text: str) -> list[str]:
    """Paragraphs (and question/answer pairs): blank-line separated, each one ends with the EOS token."""
    return [block.strip() for block in text.split("\n\n") if block.strip()]


def bpe_tokenizer(texts: Sequence[str], vocab_size: int, chat_template: str) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer trained on ``texts``; no BOS is added to encoded text."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=PAD
    )
    fast.chat_template = chat_template
    return fast


def is_question(doc: str) -> bool:
    return doc.startswith("Question: ")


def token_stream(
    tokenizer: PreTrainedTokenizerFast, docs: Sequence[str], qa_repeats: int = 1
) -> torch.Tensor:
    """The training text as one token sequence, every document followed by EOS; the question/answer pairs
    ``qa_repeats`` times over (each pass after the prose, so the text reads the same either way)."""
    eos = int(tokenizer.eos_token_id)
    ids: list[int] = []
    ordered = [d for d in docs if not is_question(d)] + [d for d in docs if is_question(d)] * qa_repeats
    for doc in ordered:
        ids += tokenizer.encode(doc, add_special_tokens=False)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.long)


def build(out_dir: Path, settings: TrainSettings, shape: DemoShape = DEFAULT_SHAPE) -> DemoResult:
    """Writes ``out_dir/target`` and ``out_dir/draft`` (replacing them); deterministic for the settings."""
    torch.manual_seed(settings.seed)
    docs = documents(corpus_text())
    tokenizer = bpe_tokenizer(docs, shape.vocab_size, CHAT_TEMPLATE)
    stream = token_stream(tokenizer, docs, settings.qa_repeats)
    model = LlamaForCausalLM(llama_config(tokenizer, shape, shape.layers))
    head = EarlyExit(model)
    started, cpu_started = time.perf_counter(), time.process_time()
    target_loss, draft_loss = train(model, head, stream, shape, settings)
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    draft = draft_from(model, head, tokenizer, shape)
    paths = {}
    for name, checkpoint in (("target", model), ("draft", draft)):
        path = out_dir / name
        if path.exists():
            shutil.rmtree(path)
        path.mkdir(parents=True)
        checkpoint.save_pretrained(str(path))
        tokenizer.save_pretrained(str(path))
        paths[name] = path
    return DemoResult(
        target=paths["target"],
        draft=paths["draft"],
        steps=settings.steps,
        train_seconds=seconds,
        train_cpu_seconds=cpu_seconds,
        target_loss=target_loss,
        draft_loss=draft_loss,
        target_parameters=sum(p.numel() for p in model.parameters()),
        draft_parameters=sum(p.numel() for p in draft.parameters()),
    )


def measure_acceptance(
    target: Path,
    draft: Path,
    prompts: Sequence[str] = SAMPLE_PROMPTS,
    draft_len: int = 4,
    max_tokens: int = 48,
) -> tuple[float, list[str]]:
    """Greedy draft-target decoding through the server's own engine: (accepted / drafted, completions)."""
    from specdeploy_server.backends.factory import build_engine  # noqa: PLC0415
    from specdeploy_server.config import ServerConfig  # noqa: PLC0415
    from specdeploy_server.core.types import SamplingParams  # noqa: PLC0415

    config = ServerConfig.model_validate(
        {
            "model": {"target": str(target), "draft": str(draft)},
            "speculative": {"method": "draftTarget", "draftLen": draft_len},
            "placement": {"device": "cpu"},
        }
    )

    async def run() -> tuple[float, list[str]]:
        engine = build_engine(config)
        await engine.start()
        texts = []
        try:
            for prompt in prompts:
                gen = engine.generate(
                    engine.tokenizer.encode(prompt), max_tokens, SamplingParams(temperature=0.0)
                )
                tokens = [t async for out in gen.outputs for t in out.token_ids]
                texts.append(engine.tokenizer.decode(tokens))
        finally:
            await engine.stop(5)
        stats = engine.stats
        return (stats.accepted / stats.drafted if stats.drafted else 0.0), texts

    return asyncio.run(run())


def steps_for(seconds: float) -> int:
    return max(1, round(seconds * STEPS_PER_SECOND))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m specdeploy_server.demo_models",
        description="Make the demo's target and draft checkpoints locally (tiny, trained in seconds on text "
        "this package ships; not real language models).",
    )
    parser.add_argument("out_dir", type=Path, help="writes OUT_DIR/target and OUT_DIR/draft")
    parser.add_argument(
        "--seconds",
        type=float,
        default=DEFAULT_SECONDS,
        help=f"nominal training budget, turned into {STEPS_PER_SECOND:g} steps per second "
        f"(default {DEFAULT_SECONDS:g})",
    )
    parser.add_argument("--steps", type=int, help="training steps (overrides --seconds)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the initial weights and data order")
    parser.add_argument("--no-measure", action="store_true", help="skip measuring the acceptance rate")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    transformers.utils.logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    steps = args.steps if args.steps is not None else steps_for(args.seconds)
    if steps < 1:
        parser.error("--steps must be at least 1")
    shape = DemoShape()
    started = time.perf_counter()
    result = build(args.out_dir, TrainSettings(steps=steps, seed=args.seed), shape)
    summary: dict[str, Any] = {
        "target": str(result.target),
        "draft": str(result.draft),
        "seed": args.seed,
        "steps": result.steps,
        "shape": asdict(shape),
        "targetParameters": result.target_parameters,
        "draftParameters": result.draft_parameters,
        "targetLoss": round(result.target_loss, 4),
        "draftLoss": round(result.draft_loss, 4),
        "trainSeconds": round(result.train_seconds, 2),
        "trainCpuSeconds": round(result.train_cpu_seconds, 2),
    }
    if not args.no_measure:
        with contextlib.redirect_stdout(sys.stderr):
            acceptance, texts = measure_acceptance(result.target, result.draft)
        summary["acceptance"] = round(acceptance, 4)
        summary["draftLen"] = 4
        summary["samples"] = dict(zip(SAMPLE_PROMPTS, texts, strict=True))
    summary["seconds"] = round(time.perf_counter() - started, 2)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
