"""What building a response needs from the server, and nothing more."""

from __future__ import annotations

from specdeploy_server.api.logprobs import LogprobFormatter
from specdeploy_server.api.textstream import IncrementalDecoder
from specdeploy_server.metrics import RequestMetrics, ServerMetrics
from specdeploy_server.tokenizer import Tokenizer


class ResponseContext:
    """The served model's name (every body carries it), the tokenizer (token ids -> text deltas), the
    logprob formatter, and the metrics a request counts into. One per server, shared by its requests."""

    def __init__(self, model: str, tokenizer: Tokenizer, metrics: ServerMetrics) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.metrics = metrics
        #: the text of single token ids, memoised for the streams' incremental decoders and the logprobs
        self.single_token_text: dict[int, str] = {}
        #: the same with special tokens kept (``skip_special_tokens: false``)
        self.single_token_text_special: dict[int, str] = {}
        #: the text a token adds after another, memoised likewise (each decoding mode its own)
        self._pair_text: dict[tuple[int, int], str] = {}
        self._pair_text_special: dict[tuple[int, int], str] = {}
        self.logprobs = LogprobFormatter(tokenizer, self.single_token_text)

    def decoder(self, skip_special_tokens: bool = True) -> IncrementalDecoder:
        """A new incremental decoder for one choice's tokens."""
        if skip_special_tokens:
            return IncrementalDecoder(self.tokenizer, self.single_token_text, pairs=self._pair_text)
        singles, pairs = self.single_token_text_special, self._pair_text_special
        return IncrementalDecoder(self.tokenizer, singles, skip_special_tokens=False, pairs=pairs)

    def request_metrics(self) -> RequestMetrics:
        return self.metrics.for_requests(self.model)

    def count_stream_failure(self) -> None:
        """A stream ended by an in-band error (its headers were sent: no status counts it)."""
        self.metrics.errors.labels(self.model, "server_error").inc()
