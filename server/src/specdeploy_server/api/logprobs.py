"""Token log-probabilities in the two OpenAI shapes (completions and chat).

The values are the target's own log-probabilities (log-softmax of its logits, before penalties, the grammar
mask, temperature and filtering: vLLM's default ``raw_logprobs``) at each emitted token; speculation changes
nothing about them, the verification pass that emits a token computes them. Each token is shown as its own
decoded text (a byte-level token that splits a character decodes to U+FFFD).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specdeploy_server.core.types import TokenLogprob
from specdeploy_server.tokenizer import Tokenizer


class LogprobFormatter:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self._text: dict[int, str] = {}

    def text(self, token: int) -> str:
        cached = self._text.get(token)
        if cached is None:
            cached = self._text[token] = self._tok.decode([token])
        return cached

    def chat(self, items: Sequence[TokenLogprob]) -> dict[str, Any]:
        """``choices[i].logprobs`` of a chat completion (or of one chunk)."""
        return {"content": [self._chat_item(item) for item in items], "refusal": None}

    def _entry(self, token: int, logprob: float) -> dict[str, Any]:
        text = self.text(token)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def _chat_item(self, item: TokenLogprob) -> dict[str, Any]:
        entry = self._entry(item.token, item.logprob)
        entry["top_logprobs"] = [self._entry(t, lp) for t, lp in item.top]
        return entry

    def completion(
        self, items: Sequence[TokenLogprob | None], tokens: Sequence[int], offset: int
    ) -> dict[str, Any]:
        """``choices[i].logprobs`` of a completion: ``items[j]`` is None for a token nobody predicted (the
        first prompt token when echoing); ``offset`` is where the first token's text starts in the choice's
        text."""
        texts = [self.text(t) for t in tokens]
        offsets: list[int] = []
        for text in texts:
            offsets.append(offset)
            offset += len(text)
        return {
            "tokens": texts,
            "token_logprobs": [None if item is None else item.logprob for item in items],
            "top_logprobs": [
                None if item is None else {self.text(t): lp for t, lp in item.top} for item in items
            ],
            "text_offset": offsets,
        }
