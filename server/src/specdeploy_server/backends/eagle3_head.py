"""An EAGLE-3 draft head as NVIDIA ModelOpt exports it (the checkpoint TensorRT-LLM's PyTorch backend loads as
``speculative_model``), loaded and run with transformers' Llama building blocks.

The format: ``config.json`` (``architectures: [LlamaForCausalLMEagle3]``, the draft layer's Llama shape,
``draft_vocab_size``, and ``eagle_config.eagle_aux_hidden_state_layer_ids``) and ``model.safetensors`` with
``fc`` (the three target hidden states fused into one), one decoder layer ``layers.0.*`` whose attention takes
``[token embedding, hidden state]`` (twice the hidden size), ``hidden_norm``, the final ``norm``, ``lm_head``
over the draft vocabulary and, when that vocabulary is smaller than the target's, ``d2t`` (draft id + d2t[id]
= target id). The token embedding is the target's own (not in the checkpoint).

Conventions this module follows exactly, because an error in either costs acceptance silently:

* Layer ids count decoder layers **by output**, as ModelOpt (a forward hook on ``layers[i]``) and TensorRT-LLM
  do: id ``i`` is the output of layer ``i``, Hugging Face's ``hidden_states[i + 1]``. vLLM and SGLang count by
  input (their id ``i + 1``).
* The first layer computes what ModelOpt's trainer computes: the decoder layer's ``input_layernorm`` runs on
  the hidden state before attention, and the head's pre-attention hook then normalises the token embedding
  with that same norm and the (already normalised) hidden state with ``hidden_norm``; the residual is the raw
  hidden state. (TensorRT-LLM applies ``hidden_norm`` to the raw hidden state: the two agree while
  ``input_layernorm`` is uniform, i.e. until training moves it.)
* Position ``t`` of the head pairs the target's hidden state at ``t`` with the embedding of token ``t + 1``
  and predicts token ``t + 2``; a drafted position takes the head's own pre-norm output at ``t - 1`` as its
  hidden state.
"""

from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaAttention,
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
)

__all__ = ["EAGLE3_ARCHITECTURES", "Eagle3Checkpoint", "Eagle3Head", "Eagle3HeadError", "load_eagle3_head"]

#: the ``architectures`` of the export this module reads (ModelOpt's EAGLE-3 export for Llama-style drafts)
EAGLE3_ARCHITECTURES = ("LlamaForCausalLMEagle3",)


class Eagle3HeadError(ValueError):
    """The checkpoint is not an EAGLE-3 head this server can run, or it does not fit the target."""


@dataclass(frozen=True)
class Eagle3Checkpoint:
    """What the head's ``config.json`` says about how it attaches to its target."""

    path: Path
    config: LlamaConfig  # the draft layer's shape, and the target's hidden and vocabulary sizes
    aux_layer_ids: tuple[int, ...]
    draft_vocab_size: int

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def vocab_size(self) -> int:
        return int(self.config.vocab_size)


def read_checkpoint(path: Path) -> Eagle3Checkpoint:
    config_file = path / "config.json"
    try:
        raw: dict[str, Any] = json.loads(config_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise Eagle3HeadError(f"EAGLE-3 head {path}: cannot read config.json: {exc}") from exc
    architectures = raw.get("architectures") or []
    if not any(a in EAGLE3_ARCHITECTURES for a in architectures):
        raise Eagle3HeadError(
            f"EAGLE-3 head {path}: architectures {architectures} is not ModelOpt's EAGLE-3 export "
            f"({', '.join(EAGLE3_ARCHITECTURES)})"
        )
    eagle = raw.get("eagle_config") or {}
    ids = eagle.get("eagle_aux_hidden_state_layer_ids") or []
    if not eagle.get("use_aux_hidden_state", bool(ids)) or not ids:
        raise Eagle3HeadError(
            f"EAGLE-3 head {path}: eagle_config.eagle_aux_hidden_state_layer_ids is empty "
            "(an EAGLE-3 head fuses target hidden states of named layers)"
        )
    if int(raw.get("num_hidden_layers", 1)) != 1:
        raise Eagle3HeadError(
            f"EAGLE-3 head {path}: num_hidden_layers {raw['num_hidden_layers']}; "
            "this server runs heads of one draft layer"
        )
    missing = [
        k for k in ("hidden_size", "vocab_size", "num_attention_heads", "intermediate_size") if k not in raw
    ]
    if missing:
        raise Eagle3HeadError(f"EAGLE-3 head {path}: config.json has no {', '.join(missing)}")
    fields = {k: v for k, v in raw.items() if k not in ("architectures", "eagle_config", "torch_dtype")}
    config = LlamaConfig(**fields)
    config._attn_implementation = "sdpa"
    return Eagle3Checkpoint(
        path=path,
        config=config,
        aux_layer_ids=tuple(int(i) for i in ids),
        draft_vocab_size=int(raw.get("draft_vocab_size") or raw["vocab_size"]),
    )


def _cache_kwarg(attention: nn.Module) -> str:
    """The keyword the installed transformers' attention takes its KV cache by."""
    parameters = inspect.signature(attention.forward).parameters
    return next(k for k in ("cache", "past_key_values", "past_key_value") if k in parameters)


class Eagle3Layer(nn.Module):
    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_idx=0)
        for name in ("q_proj", "k_proj", "v_proj"):  # the first layer attends over [embedding, hidden]
            old: nn.Linear = getattr(self.self_attn, name)
            wide = nn.Linear(2 * old.in_features, old.out_features, bias=config.attention_bias)
            setattr(self.self_attn, name, wide)
        self.mlp = LlamaMLP(config)  # type: ignore[no-untyped-call]
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.cache_kwarg = _cache_kwarg(self.self_attn)

    def forward(
        self,
        hidden: torch.Tensor,
        embeds: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        mask: torch.Tensor | None,
        cache: Any,
    ) -> torch.Tensor:
        residual = hidden
        attn_in = torch.cat(
            [self.input_layernorm(embeds), self.hidden_norm(self.input_layernorm(hidden))], dim=-1
        )
        attended, _ = self.self_attn(
            hidden_states=attn_in,
            position_embeddings=rope,
            attention_mask=mask,
            **{self.cache_kwarg: cache},
        )
        hidden = residual + attended
        out: torch.Tensor = hidden + self.mlp(self.post_attention_layernorm(hidden))
        return out


class Eagle3Head(nn.Module):
    """The head's modules, named as in the export so its state dict loads as it is."""

    def __init__(self, checkpoint: Eagle3Checkpoint) -> None:
        super().__init__()
        config = checkpoint.config
        hidden = checkpoint.hidden_size
        self.checkpoint = checkpoint
        self.fc = nn.Linear(len(checkpoint.aux_layer_ids) * hidden, hidden, bias=False)
        self.layers = nn.ModuleList([Eagle3Layer(config)])
        self.norm = LlamaRMSNorm(hidden, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(hidden, checkpoint.draft_vocab_size, bias=False)
        if checkpoint.draft_vocab_size < checkpoint.vocab_size:
            self.register_buffer("d2t", torch.zeros(checkpoint.draft_vocab_size, dtype=torch.int64))
        self.rotary = LlamaRotaryEmbedding(config)

    def fuse(self, features: torch.Tensor) -> torch.Tensor:
        """The target's hidden states of the named layers, concatenated in id order, fused into one."""
        fused: torch.Tensor = self.fc(features)
        return fused

    def forward(
        self, hidden: torch.Tensor, embeds: torch.Tensor, past: int, cache: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Positions ``past .. past + n - 1`` of one sequence (``hidden``, ``embeds``: ``[1, n, hidden]``)
        after the ``past`` positions ``cache`` holds: (logits over the draft vocabulary, pre-norm outputs),
        each ``[1, n, ...]``."""
        n = hidden.shape[1]
        positions = torch.arange(past, past + n, device=hidden.device).unsqueeze(0)
        rope = self.rotary(hidden, positions)
        mask = None
        if n > 1:  # causal among the new positions, everything cached visible
            allowed = torch.arange(past + n, device=hidden.device)[None, :] <= positions[0][:, None]
            mask = torch.zeros(allowed.shape, dtype=hidden.dtype, device=hidden.device)
            mask = mask.masked_fill(~allowed, torch.finfo(hidden.dtype).min)[None, None]
        prenorm = self.layers[0](hidden, embeds, rope, mask, cache)
        logits: torch.Tensor = self.lm_head(self.norm(prenorm))
        return logits, prenorm

    def target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary ids as target ids."""
        d2t = self.d2t_map
        return draft_ids if d2t is None else draft_ids + d2t[draft_ids]

    @property
    def d2t_map(self) -> torch.Tensor | None:
        """``d2t`` when the draft vocabulary is smaller than the target's."""
        d2t = getattr(self, "d2t", None)
        return d2t if isinstance(d2t, torch.Tensor) else None


def load_eagle3_head(
    path: Path, target_layers: int, target_hidden: int, target_vocab: int, target_lm_head: nn.Linear
) -> Eagle3Head:
    """The head at ``path``, checked against its target (layer count, hidden size, vocabulary)."""
    from safetensors.torch import load_file  # noqa: PLC0415

    checkpoint = read_checkpoint(path)
    where = f"EAGLE-3 head {path}"
    bad = [i for i in checkpoint.aux_layer_ids if not 0 <= i < target_layers]
    if bad:
        raise Eagle3HeadError(
            f"{where}: eagle_aux_hidden_state_layer_ids {list(checkpoint.aux_layer_ids)} name layers {bad} "
            f"the target does not have (it has {target_layers}, ids count from 0 by layer output)"
        )
    if checkpoint.hidden_size != target_hidden:
        raise Eagle3HeadError(
            f"{where}: hidden_size {checkpoint.hidden_size} differs from the target's {target_hidden} "
            "(the head was trained for another model)"
        )
    if checkpoint.vocab_size != target_vocab:
        raise Eagle3HeadError(
            f"{where}: vocab_size {checkpoint.vocab_size} differs from the target's {target_vocab}"
        )
    weights = path / "model.safetensors"
    if weights.is_file() and not os.access(weights, os.R_OK):
        raise Eagle3HeadError(
            f"{where}: model.safetensors is not readable by this server (uid {os.getuid()})"
        )
    try:
        state = load_file(str(weights))
    except Exception as exc:  # a missing or corrupt file: the path names it
        raise Eagle3HeadError(f"{where}: cannot read model.safetensors: {exc}") from exc
    if "lm_head.weight" not in state and checkpoint.draft_vocab_size == target_vocab:
        state["lm_head.weight"] = target_lm_head.weight.detach().clone()  # as TensorRT-LLM: the target's head
    head = Eagle3Head(checkpoint)
    try:
        result = head.load_state_dict(state, strict=False)
    except RuntimeError as exc:  # a tensor of another shape
        raise Eagle3HeadError(f"{where}: model.safetensors does not fit its config.json: {exc}") from exc
    if result.missing_keys or result.unexpected_keys:
        raise Eagle3HeadError(
            f"{where}: model.safetensors does not match the EAGLE-3 layout "
            f"(missing {sorted(result.missing_keys)}, unexpected {sorted(result.unexpected_keys)})"
        )
    return head.eval().requires_grad_(False)
