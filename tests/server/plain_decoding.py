"""Plain greedy decoding written out independently of the server: one full forward pass of the transformers
model per token (no cache, no speculation), penalties and logit_bias by their OpenAI/vLLM definitions, and
the grammar mask straight from a fresh llguidance matcher. The tests compare the server's speculative output
with it token for token."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


@dataclass(frozen=True)
class Penalties:
    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0
    bias: dict[int, float] = field(default_factory=dict)


class PlainDecoder:
    def __init__(self, model_dir: Path) -> None:
        self.tokenizer: Any = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
        model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
        self.model: Any = model.eval()
        self.vocab = int(self.model.config.vocab_size)
        self.eos = int(self.tokenizer.eos_token_id)
        self._llg_tokenizer: Any = None

    def matcher(self, grammar: str) -> Any:
        if self._llg_tokenizer is None:
            self._llg_tokenizer = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab)
        matcher = llguidance.LLMatcher(self._llg_tokenizer, grammar, log_level=0)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    @torch.inference_mode()
    def logits(self, ids: Sequence[int]) -> np.ndarray:
        row: np.ndarray = self.model(torch.tensor([list(ids)])).logits[0, -1].double().numpy()
        return row

    @torch.inference_mode()
    def all_logits(self, ids: Sequence[int]) -> np.ndarray:
        rows: np.ndarray = self.model(torch.tensor([list(ids)])).logits[0].double().numpy()
        return rows

    def greedy(
        self,
        prompt: Sequence[int],
        max_tokens: int,
        penalties: Penalties | None = None,
        grammar: str | None = None,
    ) -> list[int]:
        matcher = self.matcher(grammar) if grammar is not None else None
        out: list[int] = []
        while len(out) < max_tokens:
            x = self.logits([*prompt, *out])
            if penalties is not None:
                x = _penalised(x, prompt, out, penalties)
            if matcher is not None:
                bits = np.unpackbits(
                    np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little"
                )
                allowed = bits[: self.vocab].astype(bool)
                if not allowed.any():
                    allowed[self.eos] = True
                x = np.where(allowed, x, -np.inf)
            token = int(np.argmax(x))
            out.append(token)
            if token == self.eos:
                break
            if matcher is not None:
                assert matcher.consume_token(token)
        return out


def _penalised(x: np.ndarray, prompt: Sequence[int], out: Sequence[int], p: Penalties) -> np.ndarray:
    x = x.copy()
    for token in set(prompt) | set(out):
        if p.repetition != 1.0:
            x[token] = x[token] / p.repetition if x[token] > 0 else x[token] * p.repetition
    for token in set(out):
        x[token] -= p.frequency * out.count(token) + p.presence
    for token, value in p.bias.items():
        x[token] += value
    return x
