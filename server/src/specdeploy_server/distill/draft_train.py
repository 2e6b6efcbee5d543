"""The train step for a draft model: the deployment's draft, distilled on the target's own responses.

On every sample the frozen target gives its next-token distribution at each response position, and the draft
learns to match it (the cross-entropy of the draft's distribution against the target's, i.e. forward KL up to
a constant): what draft-target speculation accepts is exactly where the two agree. (Learning the target's
argmax alone, for greedy traffic, measured worse on the demo's models, on held-out prompts even at
temperature 0.) It runs on the
transformers path, on CPU for small models. The draft must speak the target's vocabulary with the same
tokenizer; anything else is refused before training. The output directory is a checkpoint the server loads
as ``model.draft`` (the draft's tokenizer files beside the trained weights) with ``train.json``: samples,
tokens, steps, the loss at the end, the share of response positions where the two models' argmax agreed at
the end, seconds.
"""

from __future__ import annotations

import math
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specdeploy_server.distill.prompts import DistillError
from specdeploy_server.distill.samples import (
    TrainSettings,
    tokenized_samples,
    training_batch,
    write_output,
)

__all__ = ["DraftTrainSummary", "train_draft"]

#: files of a checkpoint directory that ``save_pretrained`` writes (everything else is copied as it is)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
_WRITTEN = ("config.json", "generation_config.json", "model.safetensors.index.json")


@dataclass(frozen=True)
class DraftTrainSummary:
    samples: int
    tokens: int
    steps: int
    loss: float
    agreement: float
    seconds: float


def _same_tokenizer(target: Path, draft: Path) -> None:
    from transformers import AutoTokenizer  # noqa: PLC0415

    ours, theirs = (AutoTokenizer.from_pretrained(str(p), local_files_only=True) for p in (target, draft))
    a, b = ours.get_vocab(), theirs.get_vocab()
    if a != b:
        differ = len(set(a.items()) ^ set(b.items()))
        raise DistillError(
            f"draft {draft}: its tokenizer differs from the target's ({len(b)} vs {len(a)} tokens, "
            f"{differ} entries differ); a draft must share the target's tokenizer"
        )


def _load(path: Path) -> Any:
    from transformers import AutoModelForCausalLM  # noqa: PLC0415

    return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=torch.float32)


def _save(model: Any, source: Path, out: Path) -> None:
    """The trained draft in ``out``: the source directory's other files (tokenizer, chat template) copied,
    then the weights and config written."""
    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and not item.name.endswith(_WEIGHT_SUFFIXES) and item.name not in _WRITTEN:
            shutil.copy(item, out / item.name)
    model.save_pretrained(str(out))


def train_draft(
    target: Path, draft: Path, samples: Path, out: Path, settings: TrainSettings
) -> DraftTrainSummary:
    """Distil ``draft`` towards ``target`` on ``samples``; the new draft and ``train.json`` go to ``out``."""
    settings.check()
    _same_tokenizer(target, draft)
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    sequences = tokenized_samples(samples, target, settings.max_length)
    teacher = _load(target).eval().requires_grad_(False)
    student = _load(draft)
    if student.config.vocab_size != teacher.config.vocab_size:
        raise DistillError(
            f"draft {draft}: vocab_size {student.config.vocab_size} differs from the target's "
            f"{teacher.config.vocab_size}"
        )
    student.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=settings.learning_rate, weight_decay=0.0)
    order = random.Random(settings.seed)
    width = max(len(ids) for ids, _ in sequences)
    start = time.monotonic()
    steps, loss_value, agreement = 0, math.nan, math.nan
    while steps < settings.steps and time.monotonic() - start < settings.max_seconds:
        batch = [sequences[order.randrange(len(sequences))] for _ in range(settings.batch_size)]
        inputs, attention, loss_mask = training_batch(batch, width)
        with torch.no_grad():
            wanted = F.softmax(teacher(input_ids=inputs, attention_mask=attention).logits, dim=-1)
        logits = student(input_ids=inputs, attention_mask=attention).logits
        mask = loss_mask.bool()
        loss = -(wanted[mask] * F.log_softmax(logits[mask], dim=-1)).sum(dim=-1).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        steps += 1
        loss_value = float(loss.detach())
        agreement = float((wanted[mask].argmax(-1) == logits[mask].argmax(-1)).float().mean())
    student.eval()
    _save(student, draft, out)
    summary = DraftTrainSummary(
        samples=len(sequences),
        tokens=sum(len(ids) for ids, _ in sequences),
        steps=steps,
        loss=round(loss_value, 4),
        agreement=round(agreement, 4),
        seconds=round(time.monotonic() - start, 3),
    )
    write_output(out, summary)
    return summary
