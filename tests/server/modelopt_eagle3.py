"""EAGLE-3 heads made by NVIDIA ModelOpt itself (``modelopt.torch.speculative``, the maintained trainer), for
the tests that hold our head to ModelOpt's own forward pass.

The installed transformers' ``LlamaRotaryEmbedding`` takes no ``device`` argument, which ModelOpt's lazy
rotary initialisation passes: :func:`convert` builds the rotary embedding up front, as ModelOpt would, so its
``pseudo_speculative_generate`` runs.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding


def convert(target: Path, *, draft_vocab_size: int | None = None, seed: int = 0) -> Any:
    """The target at ``target`` converted to ModelOpt's EAGLE-3 model (default layers, a one-layer head
    shaped like the target's layers), its head's weights random, norms included (a freshly initialised
    norm is uniform and would hide which hidden state a norm is applied to)."""
    import modelopt.torch.speculative as mtsp

    model: Any = AutoModelForCausalLM.from_pretrained(str(target), local_files_only=True, dtype=torch.float32)
    config = model.config
    arch = copy.deepcopy(mtsp.config.eagle3_default_config)
    arch.update(
        {
            "intermediate_size": config.intermediate_size,
            "num_attention_heads": config.num_attention_heads,
            "num_key_value_heads": config.num_key_value_heads,
            "head_dim": config.hidden_size // config.num_attention_heads,
            "torch_dtype": "float32",
        }
    )
    if draft_vocab_size is not None:
        arch["draft_vocab_size"] = draft_vocab_size
    # the export's rope is the trained one (ModelOpt would otherwise write a YaRN extension into config.json)
    mtsp.convert(model, [("eagle", {"eagle_architecture_config": arch, "eagle_export_rope_scaling": {}})])
    module = model.eagle_module
    module.rotary_emb = LlamaRotaryEmbedding(config=model.eagle_config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if name.endswith("norm.weight"):
                parameter.copy_(0.5 + torch.rand(parameter.shape, generator=generator))
            else:
                parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.2)
        if draft_vocab_size is not None:  # the draft vocabulary: every other target id
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
