"""Structured output with llguidance: grammars compiled against the served tokenizer, and the per-sequence
:class:`~specdeploy_server.core.types.TokenConstraint` the speculative core calls.

llguidance (PyPI ``llguidance``, the engine llgtrt uses) compiles JSON schemas, Lark grammars and regular
expressions into a matcher that computes, for the current state, the bitmask of allowed tokens in
microseconds, and can consume and roll back tokens. That is what speculation needs: the target's logits are
masked at each of the ``k + 1`` positions along the draft (consume the draft token by token, read the mask,
roll back), draft tokens the grammar forbids are cut before verification, and a token that is the only one
allowed is emitted without a model step.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from specdeploy_server.core.types import BoolArray

#: JSON output without free whitespace between tokens (``{"a": 1, "b": [2, 3]}``): the separators are
#: fixed, so they are forced tokens, and a model cannot pad its output with whitespace until max_tokens.
#: A schema's own ``x-guidance`` options override these.
JSON_DEFAULTS: dict[str, Any] = {"whitespace_flexible": False}


class GrammarError(ValueError):
    """The grammar (or schema) does not compile; the message says why."""


@dataclass(frozen=True)
class Guide:
    """What a request asked its output to follow, in the request's own terms: ``kind`` is ``json_object``,
    ``json_schema`` (``source``: the schema as JSON text), ``lark`` (Lark source) or ``llguidance`` (a
    top-level llguidance grammar as JSON text). Backends that constrain decoding themselves (TensorRT-LLM's
    guided decoding) take this form; :meth:`grammar` is the llguidance grammar our own core compiles."""

    kind: str
    source: str = ""

    def grammar(self) -> str:
        if self.kind == "json_object":
            return GrammarCompiler.from_json_schema({"type": "object"})
        if self.kind == "json_schema":
            return GrammarCompiler.from_json_schema(json.loads(self.source))
        if self.kind == "lark":
            return GrammarCompiler.from_lark(self.source)
        if self.kind == "llguidance":
            return self.source
        raise GrammarError(f"unknown grammar kind {self.kind}")


def _llguidance() -> Any:
    import llguidance  # noqa: PLC0415 (lazy: the package imports without it)
    import llguidance.hf  # noqa: PLC0415

    return llguidance


class GrammarCompiler:
    """Compiles grammars for one tokenizer. The llguidance tokenizer is built once, on first use (it indexes
    the vocabulary: tens of milliseconds for 128k tokens)."""

    def __init__(self, hf_tokenizer: Any, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self._hf = hf_tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self._lock = threading.Lock()
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        with self._lock:
            if self._tokenizer is None:
                eos = sorted(self.eos_token_ids) or None
                self._tokenizer = _llguidance().hf.from_tokenizer(
                    self._hf, n_vocab=self.vocab_size, eos_token=eos
                )
            return self._tokenizer

    @staticmethod
    def from_json_schema(schema: dict[str, Any]) -> str:
        llg = _llguidance()
        try:
            return str(llg.LLMatcher.grammar_from_json_schema(schema, defaults=JSON_DEFAULTS))
        except (ValueError, TypeError) as exc:
            raise GrammarError(f"invalid JSON schema: {exc}") from exc

    @staticmethod
    def from_lark(lark: str) -> str:
        return str(_llguidance().LLMatcher.grammar_from_lark(lark))

    def compile(self, grammar: str, guide: Guide | None = None) -> GrammarConstraint:
        """A fresh constraint at the grammar's start (raises GrammarError when it does not compile);
        ``guide``: the request's form of it, kept on the constraint for backends that take that form."""
        llg = _llguidance()
        tokenizer = self.tokenizer
        problem = llg.LLMatcher.validate_grammar(grammar, tokenizer)
        if problem and not problem.startswith("WARNING"):
            raise GrammarError(problem)
        matcher = llg.LLMatcher(tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise GrammarError(matcher.get_error())
        return GrammarConstraint(matcher, self.vocab_size, self.eos_token_ids, guide)


class GrammarConstraint:
    """One sequence's grammar state (an ``LLMatcher``); implements ``TokenConstraint``."""

    def __init__(
        self, matcher: Any, vocab_size: int, eos_token_ids: frozenset[int], guide: Guide | None = None
    ) -> None:
        self.guide = guide
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._eos = eos_token_ids
        self._eos_row = np.zeros(vocab_size, dtype=bool)
        self._eos_row[[t for t in eos_token_ids if t < vocab_size]] = True

    def copy(self) -> GrammarConstraint:
        """An independent constraint in the same state (one per choice when ``n > 1``)."""
        return GrammarConstraint(self._matcher.deep_copy(), self._vocab_size, self._eos, self.guide)

    @property
    def finished(self) -> bool:
        """The grammar accepts the text so far and allows nothing more than end-of-sequence."""
        return bool(self._matcher.is_stopped())

    def _allowed(self) -> BoolArray:
        raw = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        bits = np.unpackbits(raw, bitorder="little")[: self._vocab_size].astype(bool)
        if not bits.any():  # stopped or in error: only the end of the sequence is left
            return self._eos_row.copy()
        return bits

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        ends = next((i for i, token in enumerate(tokens) if token in self._eos), len(tokens))
        matcher = self._matcher
        consumed = int(matcher.try_consume_tokens([int(t) for t in tokens[:ends]])) if ends else 0
        allowed = consumed
        if consumed == ends < len(tokens) and self._allowed()[tokens[ends]]:
            allowed += 1  # an end-of-sequence token the grammar accepts here
        if consumed:
            matcher.rollback(consumed)
        return allowed

    def masks(self, draft: Sequence[int], vocab_size: int) -> BoolArray:
        rows = np.zeros((len(draft) + 1, vocab_size), dtype=bool)
        matcher = self._matcher
        consumed = 0
        width = min(vocab_size, self._vocab_size)
        for i in range(len(draft) + 1):
            rows[i, :width] = self._allowed()[:width]
            if i == len(draft):
                break
            token = int(draft[i])
            if token in self._eos:  # the sequence ends there: later rows are never used
                rows[i + 1 :] = rows[i]
                break
            if not matcher.consume_token(token):
                raise RuntimeError(f"draft token {token} is not allowed: {matcher.get_error()}")
            consumed += 1
        if consumed:
            matcher.rollback(consumed)
        return rows

    def take_forced(self, limit: int) -> list[int]:
        forced: list[int] = []
        while len(forced) < limit and not self._matcher.is_stopped():
            allowed = np.flatnonzero(self._allowed())
            if len(allowed) != 1 or int(allowed[0]) in self._eos:
                break
            token = int(allowed[0])
            if not self._matcher.consume_token(token):
                break
            forced.append(token)
        return forced

    def forced_after(self, prefix: Sequence[int], limit: int) -> list[int] | None:
        matcher = self._matcher
        if any(t in self._eos for t in prefix):
            return None if self.allowed_prefix(prefix) < len(prefix) else []
        consumed = int(matcher.try_consume_tokens([int(t) for t in prefix]))
        if consumed < len(prefix):
            if consumed:
                matcher.rollback(consumed)
            return None
        forced = self.take_forced(limit)
        if consumed + len(forced):
            matcher.rollback(consumed + len(forced))
        return forced

    def advance(self, tokens: Sequence[int]) -> None:
        matcher = self._matcher
        for token in tokens:
            if token in self._eos:
                return
            if not matcher.consume_token(int(token)):
                raise RuntimeError(f"emitted token {token} is not allowed: {matcher.get_error()}")
