"""The generate step's samples as training sequences: each request tokenised as the server tokenises it,
followed by the target's response."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from specdeploy_server.distill.prompts import DistillError, read_lines

__all__ = ["TrainSettings", "tokenized_samples", "training_batch", "write_output"]


@dataclass(frozen=True)
class TrainSettings:
    """How long and how a train step trains (each step's command line has its own defaults)."""

    steps: int = 200
    batch_size: int = 4
    learning_rate: float = 1e-3
    max_seconds: float = 3600.0
    max_length: int = 1024
    seed: int = 0
    threads: int | None = None

    def check(self) -> None:
        if self.steps < 1:
            raise DistillError(f"steps {self.steps}: the budget trains nothing (at least 1 step)")
        if self.batch_size < 1:
            raise DistillError(f"batch size {self.batch_size}: at least 1")


def tokenized_samples(samples: Path, target: Path, max_length: int) -> list[tuple[list[int], int]]:
    """(token ids, where the response starts) per sample, as the server would tokenise the request."""
    from specdeploy_server.tokenizer import HFTokenizer  # noqa: PLC0415

    tokenizer = HFTokenizer(target)
    out = []
    for number, line in enumerate(read_lines(samples, "samples"), 1):
        if not line.strip():
            continue
        try:
            sample = json.loads(line)
            prompt = sample["prompt"] if "prompt" in sample else tokenizer.render_chat(sample["messages"])
            completion = sample["completion"]
        except (json.JSONDecodeError, KeyError, TypeError) as exc:
            raise DistillError(f"samples {samples} line {number}: not a sample ({exc})") from exc
        head = tokenizer.encode(prompt)
        ids = (head + tokenizer.encode(completion, add_special_tokens=False))[:max_length]
        if len(ids) - len(head) >= 2:  # the head learns from at least two response tokens
            out.append((ids, len(head)))
    if not out:
        raise DistillError(f"samples {samples}: no sample with a response of two tokens or more")
    return out


def training_batch(
    batch: list[tuple[list[int], int]], width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(input ids, attention mask, loss mask) of ``batch`` padded on the right to ``width``: the loss mask
    holds the positions whose next token is part of the response."""
    inputs = torch.zeros(len(batch), width, dtype=torch.long)
    attention = torch.zeros(len(batch), width, dtype=torch.long)
    loss_mask = torch.zeros(len(batch), width, dtype=torch.long)
    for row, (ids, response) in enumerate(batch):
        inputs[row, : len(ids)] = torch.tensor(ids)
        attention[row, : len(ids)] = 1
        loss_mask[row, response - 1 : len(ids) - 1] = 1
    return inputs, attention, loss_mask


def write_output(out: Path, summary: Any) -> None:
    """``train.json`` (the summary, a dataclass) beside what was trained, and every file of ``out`` readable
    by all: a serving pod may run under another uid than the trainer (ModelOpt writes its weights 0600)."""
    (out / "train.json").write_text(json.dumps(asdict(summary), indent=2) + "\n", encoding="utf-8")
    for item in out.iterdir():
        item.chmod(0o644)
