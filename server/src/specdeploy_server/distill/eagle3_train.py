"""The train step for an EAGLE-3 head: NVIDIA ModelOpt (``modelopt.torch.speculative``) converts the target,
trains the head on the target's own responses, and exports it in the format TensorRT-LLM's PyTorch backend
and our reference backend load.

Each sample is tokenised as the server tokenises a request (the target's chat template for a chat), followed
by the target's response; the loss covers the response's positions only. The target stays frozen (ModelOpt's
default); ModelOpt's training-time test unrolls the head three steps. Every batch is padded to the longest
sample (ModelOpt keeps one attention mask per unrolled step, sized once). Training stops after ``steps``
updates or at ``max_seconds``, whichever comes first. The export's rope is the trained one (ModelOpt would
otherwise write a YaRN extension the head never saw into ``config.json``), and its files are readable by
every user, as a serving pod under another uid needs them. ``train.json`` records what was trained:
samples, tokens, steps, the loss and the head's accuracy at the end, seconds.
"""

from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from specdeploy_server.distill.prompts import DistillError
from specdeploy_server.distill.samples import (
    TrainSettings,
    tokenized_samples,
    training_batch,
    write_output,
)

__all__ = ["TrainSummary", "eagle3_model", "train_eagle3"]


@dataclass(frozen=True)
class TrainSummary:
    samples: int
    tokens: int
    steps: int
    loss: float
    accuracy: float
    seconds: float
    aux_layer_ids: list[int]


def eagle3_model(target: Path, draft_vocab_size: int | None = None) -> Any:
    """``target`` converted by ModelOpt to its EAGLE-3 model: the frozen target with a new one-layer head
    shaped like the target's layers (over ``draft_vocab_size`` tokens, with a ``d2t`` map, when given)."""
    import modelopt.torch.speculative as mtsp  # noqa: PLC0415
    from transformers import AutoModelForCausalLM  # noqa: PLC0415
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: PLC0415

    model: Any = AutoModelForCausalLM.from_pretrained(str(target), local_files_only=True, dtype=torch.float32)
    config = model.config
    if not hasattr(getattr(model, "model", None), "layers"):
        raise DistillError(
            f"target {target}: architecture {config.architectures} has no decoder layers where ModelOpt's "
            "EAGLE-3 trainer looks for them (model.layers)"
        )
    arch = copy.deepcopy(mtsp.config.eagle3_default_config)
    arch.update(
        {
            "intermediate_size": config.intermediate_size,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": getattr(config, "num_key_value_heads", config.num_attention_heads),
            "head_dim": getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads,
            "rms_norm_eps": getattr(config, "rms_norm_eps", 1e-5),
            "torch_dtype": "float32",
        }
    )
    if draft_vocab_size is not None:
        arch["draft_vocab_size"] = draft_vocab_size
    settings = {
        "eagle_architecture_config": arch,
        "eagle_export_rope_scaling": {},
        "eagle_use_torch_compile": False,
    }
    try:
        mtsp.convert(model, [("eagle", settings)])
    except (ValueError, AssertionError, AttributeError) as exc:
        raise DistillError(f"target {target}: ModelOpt cannot add an EAGLE-3 head to it ({exc})") from exc
    # ModelOpt initialises the head's rotary embedding lazily with a `device` argument that newer transformers
    # no longer take: built here, as ModelOpt would
    model.eagle_module.rotary_emb = LlamaRotaryEmbedding(config=model.eagle_config)
    return model


def train_eagle3(target: Path, samples: Path, out: Path, settings: TrainSettings) -> TrainSummary:
    """Train a head for ``target`` on ``samples`` (the generate step's ``samples.jsonl``); export it to
    ``out`` with ``train.json``."""
    from modelopt.torch.export import export_speculative_decoding  # noqa: PLC0415

    settings.check()
    if settings.threads is not None:
        torch.set_num_threads(settings.threads)
    torch.manual_seed(settings.seed)
    sequences = tokenized_samples(samples, target, settings.max_length)
    model = eagle3_model(target)
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=settings.learning_rate)
    order = random.Random(settings.seed)
    start = time.monotonic()
    steps, loss, accuracy = 0, math.nan, math.nan
    width = max(len(ids) for ids, _ in sequences)
    while steps < settings.steps and time.monotonic() - start < settings.max_seconds:
        batch = [sequences[order.randrange(len(sequences))] for _ in range(settings.batch_size)]
        inputs, attention, loss_mask = training_batch(batch, width)
        output = model(input_ids=inputs, attention_mask=attention, loss_mask=loss_mask)
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        steps += 1
        loss = float(output.loss.detach())
        accuracy = float(output.train_acc[0][0])
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    export_speculative_decoding(model, export_dir=out)
    summary = TrainSummary(
        samples=len(sequences),
        tokens=sum(len(ids) for ids, _ in sequences),
        steps=steps,
        loss=round(loss, 4),
        accuracy=round(accuracy, 4),
        seconds=round(time.monotonic() - start, 3),
        aux_layer_ids=list(model.eagle_config.eagle_aux_hidden_state_layer_ids),
    )
    write_output(out, summary)
    return summary
