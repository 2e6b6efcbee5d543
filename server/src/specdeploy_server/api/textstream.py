"""Token ids -> text deltas for streaming: incremental detokenisation and stop strings across chunks."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

from specdeploy_server.tokenizer import Tokenizer

_REPLACEMENT = "\ufffd"


class IncrementalDecoder:
    """Decodes a growing list of token ids into stable text deltas.

    Text is produced from a sliding window of ids (so each step decodes a few tokens, not the whole output),
    and held back while it ends in an incomplete UTF-8 sequence (a byte-level token can split a character).
    Each feed decodes the window of the previous feed's tokens (the text already sent) and the window with
    the new tokens; ``singles``, when given, memoises the decoding of single token ids (a deterministic
    function of the id, shared by every request of a server and bounded by the vocabulary), so the previous
    window of a stream that emits one token per step is a dictionary lookup. ``pairs``, when given, memoises
    the delta a token adds after another (a deterministic function of the two ids, also shared): a stream
    that emits one token per step then decodes only the pairs it has not met before (text repeats its
    pairs of tokens; the memo stops growing at ``MAX_PAIRS``).
    """

    #: at most this many ids are memoised (a tokenizer's vocabulary is smaller; the bound guards ids beyond)
    MAX_SINGLES = 1 << 18
    #: at most this many pairs of ids are memoised (a few MB)
    MAX_PAIRS = 1 << 17

    def __init__(
        self,
        tokenizer: Tokenizer,
        singles: dict[int, str] | None = None,
        skip_special_tokens: bool = True,
        pairs: dict[tuple[int, int], str] | None = None,
    ) -> None:
        self._decode: Callable[[Sequence[int]], str] = (
            tokenizer.decode
            if skip_special_tokens
            else functools.partial(tokenizer.decode, skip_special_tokens=False)
        )
        self._singles = singles
        self._pairs = pairs
        self._ids: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0

    def _window(self, start: int, end: int) -> str:
        singles = self._singles
        if singles is not None and end - start == 1:
            token = self._ids[start]
            text = singles.get(token)
            if text is None:
                text = self._decode([token])
                if len(singles) < self.MAX_SINGLES:
                    singles[token] = text
            return text
        return self._decode(self._ids[start:end])

    def feed(self, token_ids: Sequence[int]) -> str:
        ids = self._ids
        read = self._read_offset
        pairs = self._pairs
        pair: tuple[int, int] | None = None
        if pairs is not None and len(token_ids) == 1 and read - self._prefix_offset == 1 and read == len(ids):
            # one token after one already sent, nothing held back: the delta is the pair's
            pair = (ids[-1], token_ids[0])
            delta = pairs.get(pair)
            if delta is not None:
                ids.append(pair[1])
                self._prefix_offset, self._read_offset = read, read + 1
                return delta
        ids.extend(token_ids)
        prefix = self._window(self._prefix_offset, read)
        full = self._decode(ids[self._prefix_offset :])
        if full.endswith(_REPLACEMENT) or len(full) < len(prefix):
            return ""
        self._prefix_offset = read
        self._read_offset = len(ids)
        delta = full[len(prefix) :]
        if pair is not None and pairs is not None and len(pairs) < self.MAX_PAIRS:
            pairs[pair] = delta
        return delta

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character becomes U+FFFD)."""
        prefix = self._window(self._prefix_offset, self._read_offset)
        full = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        return full[len(prefix) :] if full.startswith(prefix) else ""


class StopMatcher:
    """Cuts the text at the first stop string, even when it arrives split over several chunks.

    Text that could be the beginning of a stop string is held back until it is known not to be one. With
    ``include`` (``include_stop_str_in_output``) the stop string itself ends the text instead of being cut.
    """

    def __init__(self, stops: Sequence[str], include: bool = False) -> None:
        self.stops = [s for s in stops if s]
        self._include = include
        self._held = ""
        self.stopped = False

    def feed(self, text: str) -> str:
        if self.stopped:
            return ""
        buffer = self._held + text
        if not self.stops:
            self._held = ""
            return buffer
        found = [(i, -len(s)) for s in self.stops if (i := buffer.find(s)) >= 0]
        if found:
            cut, minus_length = min(found)
            self.stopped = True
            self._held = ""
            return buffer[: cut - minus_length] if self._include else buffer[:cut]
        keep = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - keep :] if keep else ""
        return buffer[: len(buffer) - keep]

    def flush(self) -> str:
        held, self._held = self._held, ""
        return "" if self.stopped else held

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of ``buffer`` that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stops:
            for n in range(min(len(stop) - 1, len(buffer)), best, -1):
                if buffer.endswith(stop[:n]):
                    best = n
                    break
        return best
