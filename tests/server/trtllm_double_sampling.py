"""The LLM API double's sampling: penalties, top-k/top-p/min-p, guided decoding, as TensorRT-LLM applies them.

* ``GuidedDecodingParams`` (``tensorrt_llm/sampling_params.py``): a kw-only dataclass with ``json``,
  ``regex``, ``grammar``, ``json_object`` and ``structural_tag``; ``_validate`` (run by ``SamplingParams``)
  raises ``ValueError`` when more than one guide is set.
* Guides are compiled as TensorRT-LLM's llguidance backend compiles them
  (``tensorrt_llm/_torch/pyexecutor/grammar_matcher.py``, ``LLGuidanceMatcherFactory``): ``json_object`` as
  the schema ``{"type": "object"}``, ``json`` with ``grammar_from_json_schema``, ``regex`` with
  ``grammar_from_regex``, ``grammar`` as Lark (``grammar_from_lark``); ``structural_tag`` is refused
  ("Unsupported guide type", ``ValueError``). The mask is applied to the target's logits at every verified
  position, so the emitted tokens follow the grammar whatever the drafter proposed.
* Penalties (the double's reading of the sampler; the real kernel's treatment of prompt tokens for presence
  and frequency is not verified): repetition over prompt and output tokens (CTRL: positive logits divided,
  negative multiplied), presence and frequency over output tokens; then temperature, top-k, top-p, min-p.
* Values the double refuses as TensorRT-LLM's ``SamplingConfig`` checks do (``ValueError`` here):
  ``repetition_penalty`` ≤ 0, ``top_k`` < 0, ``min_p`` outside [0, 1].
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, fields
from typing import Any

import llguidance
import llguidance.hf
import numpy as np
import torch


@dataclass(kw_only=True)
class GuidedDecodingParams:
    json: str | dict[str, Any] | None = None
    regex: str | None = None
    grammar: str | None = None
    json_object: bool = False
    structural_tag: str | None = None

    def _validate(self) -> None:
        guides = sum(bool(getattr(self, f.name)) for f in fields(self))
        if guides > 1:
            raise ValueError(f"Only one guide can be used for a request, but got {guides}.")


def check_sampling_values(params: Any) -> None:
    """What the executor's ``SamplingConfig`` refuses (the double raises ``ValueError``)."""
    if params.repetition_penalty is not None and params.repetition_penalty <= 0:
        raise ValueError(f"repetition_penalty must be > 0, got {params.repetition_penalty}")
    if params.top_k is not None and params.top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {params.top_k}")
    if params.min_p is not None and not 0.0 <= params.min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {params.min_p}")


class GuideCompiler:
    """``LLGuidanceMatcherFactory``: one llguidance tokenizer for the LLM, one matcher per request."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token: int | None) -> None:
        self.vocab_size = vocab_size
        self.eos_token = eos_token
        self._tokenizer = llguidance.hf.from_tokenizer(hf_tokenizer, n_vocab=vocab_size, eos_token=eos_token)

    def matcher(self, guide: GuidedDecodingParams) -> Any:
        if guide.json_object:
            grammar = llguidance.LLMatcher.grammar_from_json_schema('{"type": "object"}')
        elif guide.json is not None:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(guide.json)
        elif guide.regex is not None:
            grammar = llguidance.LLMatcher.grammar_from_regex(guide.regex)
        elif guide.grammar is not None:
            grammar = llguidance.LLMatcher.grammar_from_lark(guide.grammar)
        else:
            raise ValueError("Unsupported guide type: STRUCTURAL_TAG.")
        matcher = llguidance.LLMatcher(self._tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"LLGuidance matcher error: {matcher.get_error()}")
        return matcher

    def allowed(self, matcher: Any, width: int) -> torch.Tensor:
        """The tokens the matcher allows next (only the end id once it has stopped)."""
        raw = np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(raw, bitorder="little")[: self.vocab_size].astype(bool)
        out = torch.zeros(width, dtype=torch.bool)
        if not bits.any() and self.eos_token is not None:
            out[self.eos_token] = True
            return out
        n = min(width, len(bits))
        out[:n] = torch.from_numpy(bits[:n])
        return out


def penalised(logits: torch.Tensor, params: Any, prompt: list[int], output: list[int]) -> torch.Tensor:
    x = logits.double().clone()
    rep = params.repetition_penalty
    if rep is not None and rep != 1.0:
        seen = torch.tensor(sorted(set(prompt) | set(output)), dtype=torch.long)
        values = x[seen]
        x[seen] = torch.where(values > 0, values / rep, values * rep)
    counts = Counter(output)
    if counts and (params.presence_penalty or params.frequency_penalty):
        ids = torch.tensor(list(counts), dtype=torch.long)
        n = torch.tensor([counts[i] for i in counts], dtype=torch.float64)
        x[ids] -= (params.presence_penalty or 0.0) + (params.frequency_penalty or 0.0) * n
    return x


def probabilities(logits: torch.Tensor, params: Any) -> torch.Tensor:
    probs = torch.softmax(logits.double() / (params.temperature or 1.0), dim=-1)
    if params.top_k is not None and params.top_k > 0:
        kth = torch.topk(probs, min(params.top_k, probs.numel())).values[-1]
        probs = torch.where(probs >= kth, probs, torch.zeros_like(probs))
    if params.top_p is not None and params.top_p < 1.0:
        sorted_p, order = torch.sort(probs / probs.sum(), descending=True)
        keep = (torch.cumsum(sorted_p, 0) - sorted_p) < params.top_p
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[order[keep]] = True
        probs = torch.where(mask, probs, torch.zeros_like(probs))
    if params.min_p is not None and params.min_p > 0.0:
        probs = torch.where(probs >= params.min_p * probs.max(), probs, torch.zeros_like(probs))
    return probs / probs.sum()
