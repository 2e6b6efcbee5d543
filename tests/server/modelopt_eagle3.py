"""EAGLE-3 heads made by NVIDIA ModelOpt itself (``modelopt.torch.speculative``, the maintained trainer,
through the train step's own conversion), for the tests that hold our head to ModelOpt's own forward pass."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from specdeploy_server.distill.eagle3_train import eagle3_model


def convert(target: Path, *, draft_vocab_size: int | None = None, seed: int = 0) -> Any:
    """The trainer's EAGLE-3 model of ``target`` (ModelOpt's conversion), its head's weights random, norms
    included (a freshly initialised norm is uniform and would hide which hidden state a norm is applied to);
    with ``draft_vocab_size``, a draft vocabulary of every other target id."""
    model = eagle3_model(target, draft_vocab_size)
    module = model.eagle_module
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(0.5 + torch.rand(parameter.shape, generator=generator))
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
        if draft_vocab_size is not None:
            ids = torch.arange(draft_vocab_size) * 2
            module.d2t.copy_(ids - torch.arange(draft_vocab_size))
    return model.eval()


def export(model: Any, directory: Path) -> Path:
    """ModelOpt's deployment export (``config.json`` + ``model.safetensors``) into ``directory``."""
    from modelopt.torch.export import export_speculative_decoding

    export_speculative_decoding(model, export_dir=directory)
    return directory


def modelopt_drafts(model: Any, token_ids: list[int], steps: int) -> tuple[int, list[int]]:
    """ModelOpt's own drafting: the target's next token after ``token_ids``, and ``steps`` greedy drafts."""
    with torch.no_grad():
        base, drafts = model.pseudo_speculative_generate(torch.tensor([token_ids]), steps=steps)
    return int(base[0, 0]), [int(t) for t in drafts[0]]
