"""Token log-probabilities in the two OpenAI shapes (completions and chat).

The values are the target's own log-probabilities (log-softmax of its logits, before penalties, the grammar
mask, temperature and filtering: vLLM's default ``raw_logprobs``) at each emitted token; speculation changes
nothing about them, the verification pass that emits a token computes them. Each token is shown as its own
decoded text (a byte-level token that splits a character decodes to U+FFFD).
"""

from __future__ import annotations

from collections.abc import Sequence

from specdeploy_server.api.contract import ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob
from specdeploy_server.core.types import TokenLogprob
from specdeploy_server.tokenizer import Tokenizer


class LogprobFormatter:
    """``texts``: the text of single token ids, memoised here (a server shares one such memo)."""

    def __init__(self, tokenizer: Tokenizer, texts: dict[int, str] | None = None) -> None:
        self._tok = tokenizer
        self._text = {} if texts is None else texts

    def text(self, token: int) -> str:
        cached = self._text.get(token)
        if cached is None:
            cached = self._text[token] = self._tok.decode([token])
        return cached

    def chat(self, items: Sequence[TokenLogprob]) -> ChatLogprobs:
        """``choices[i].logprobs`` of a chat completion (or of one chunk)."""
        return ChatLogprobs(content=[self._chat_item(item) for item in items], refusal=None)

    def _top(self, token: int, logprob: float) -> TopLogprob:
        text = self.text(token)
        return TopLogprob(token=text, logprob=logprob, bytes=list(text.encode("utf-8")))

    def _chat_item(self, item: TokenLogprob) -> ChatTokenLogprob:
        text = self.text(item.token)
        return ChatTokenLogprob(
            token=text,
            logprob=item.logprob,
            bytes=list(text.encode("utf-8")),
            top_logprobs=[self._top(t, lp) for t, lp in item.top],
        )

    def completion(
        self, items: Sequence[TokenLogprob | None], tokens: Sequence[int], offset: int
    ) -> CompletionLogprobs:
        """``choices[i].logprobs`` of a completion: ``items[j]`` is None for a token nobody predicted (the
        first prompt token when echoing); ``offset`` is where the first token's text starts in the choice's
        text."""
        texts = [self.text(t) for t in tokens]
        offsets: list[int] = []
        for text in texts:
            offsets.append(offset)
            offset += len(text)
        return CompletionLogprobs(
            tokens=texts,
            token_logprobs=[None if item is None else item.logprob for item in items],
            top_logprobs=[
                None if item is None else {self.text(t): lp for t, lp in item.top} for item in items
            ],
            text_offset=offsets,
        )
