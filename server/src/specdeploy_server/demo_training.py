"""Training the demo's models (``demo_models`` says what they are): the target and its early exit trained
together, and the draft cut from them."""

from __future__ import annotations

import copy
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast


@dataclass(frozen=True)
class DemoShape:
    vocab_size: int = 768
    hidden_size: int = 128
    layers: int = 4
    draft_layers: int = 1
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 512


@dataclass(frozen=True)
class TrainSettings:
    steps: int
    seed: int = 0
    batch_size: int = 16
    seq_len: int = 64
    learning_rate: float = 3e-3
    warmup_steps: int = 20
    exit_weight: float = 1.0  # weight of the draft's (early exit's) loss beside the target's
    distill_weight: float = 0.5  # share of the early exit's loss that imitates the target (vs the data)
    qa_repeats: int = 3  # question/answer pairs are short: repeated in the training stream so chat works


def llama_config(tokenizer: PreTrainedTokenizerFast, shape: DemoShape, layers: int) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_position_embeddings,
        initializer_range=0.02,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


def _batches(stream: torch.Tensor, settings: TrainSettings) -> Iterator[torch.Tensor]:
    """Random windows of ``seq_len + 1`` tokens, in an order fixed by the seed."""
    gen = torch.Generator().manual_seed(settings.seed + 1)
    span = settings.seq_len + 1
    if len(stream) <= span:
        raise ValueError(f"corpus too short: {len(stream)} tokens for windows of {span}")
    offsets = torch.arange(span)
    while True:
        starts = torch.randint(0, len(stream) - span + 1, (settings.batch_size,), generator=gen)
        yield stream[starts[:, None] + offsets[None, :]]


def _learning_rate(step: int, settings: TrainSettings) -> float:
    if step < settings.warmup_steps:
        return settings.learning_rate * (step + 1) / settings.warmup_steps
    progress = (step - settings.warmup_steps) / max(1, settings.steps - settings.warmup_steps)
    return settings.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


class EarlyExit(torch.nn.Module):
    """The draft's own head: a final RMS norm and an LM head on the output of the target's first layers."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        super().__init__()
        self.norm = copy.deepcopy(model.model.norm)
        self.lm_head = copy.deepcopy(model.lm_head)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.lm_head(self.norm(hidden))
        return logits


def train(
    model: LlamaForCausalLM, head: EarlyExit, stream: torch.Tensor, shape: DemoShape, settings: TrainSettings
) -> tuple[float, float]:
    """Trains the target and the early exit together; returns their final losses (mean of the last steps)."""
    captured: list[torch.Tensor] = []

    def keep(_module: torch.nn.Module, _inputs: Any, output: Any) -> None:
        captured.append(output[0] if isinstance(output, tuple) else output)

    hook = model.model.layers[shape.draft_layers - 1].register_forward_hook(keep)
    params = [*model.parameters(), *head.parameters()]
    optimizer = torch.optim.AdamW(params, lr=settings.learning_rate, weight_decay=0.0, betas=(0.9, 0.98))
    vocab = model.config.vocab_size
    recent: list[tuple[float, float]] = []
    model.train()
    try:
        for step, window in zip(range(settings.steps), _batches(stream, settings), strict=False):
            for group in optimizer.param_groups:
                group["lr"] = _learning_rate(step, settings)
            captured.clear()
            inputs, labels = window[:, :-1], window[:, 1:]
            logits = model(input_ids=inputs).logits
            target_loss = F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))
            exit_logits = head(captured[0]).reshape(-1, vocab)
            data_loss = F.cross_entropy(exit_logits, labels.reshape(-1))
            teacher = F.softmax(logits.detach().reshape(-1, vocab), dim=-1)
            distill_loss = F.cross_entropy(exit_logits, teacher)
            draft_loss = (1 - settings.distill_weight) * data_loss + settings.distill_weight * distill_loss
            loss = target_loss + settings.exit_weight * draft_loss
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            recent = [*recent[-9:], (target_loss.item(), data_loss.item())]
    finally:
        hook.remove()
    model.eval()  # type: ignore[no-untyped-call]
    if not recent:
        return math.nan, math.nan
    return (
        sum(t for t, _ in recent) / len(recent),
        sum(d for _, d in recent) / len(recent),
    )


def draft_from(
    model: LlamaForCausalLM, head: EarlyExit, tokenizer: PreTrainedTokenizerFast, shape: DemoShape
) -> LlamaForCausalLM:
    """A standalone checkpoint: the target's embeddings and first layers, the early exit's norm and head."""
    draft = LlamaForCausalLM(llama_config(tokenizer, shape, shape.draft_layers))
    state = {
        key: value
        for key, value in model.state_dict().items()
        if not key.startswith(("model.layers.", "model.norm.", "lm_head."))
        or (key.startswith("model.layers.") and int(key.split(".")[2]) < shape.draft_layers)
    }
    state.update({f"model.norm.{k}": v for k, v in head.norm.state_dict().items()})
    state.update({f"lm_head.{k}": v for k, v in head.lm_head.state_dict().items()})
    draft.load_state_dict(state, strict=True)
    draft.eval()  # type: ignore[no-untyped-call]
    return draft
