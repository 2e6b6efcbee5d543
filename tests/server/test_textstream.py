"""Streaming text: incremental detokenisation and stop strings split across chunks."""

from __future__ import annotations

import pytest
from specdeploy_server.api.textstream import IncrementalDecoder, StopMatcher
from specdeploy_server.tokenizer import HFTokenizer

from tests.server.conftest import TinyModels


def _feed_all(matcher: StopMatcher, pieces: list[str]) -> str:
    out = "".join(matcher.feed(p) for p in pieces)
    return out + matcher.flush()


@pytest.mark.parametrize(
    "pieces",
    [["hello wor", "ld END tail"], ["hello world E", "N", "D tail"], ["hello world ", "END", " tail"]],
)
def test_a_stop_string_split_over_chunks_is_cut_exactly(pieces: list[str]) -> None:
    matcher = StopMatcher(["END"])
    assert _feed_all(matcher, pieces) == "hello world "
    assert matcher.stopped


def test_text_that_only_looks_like_a_stop_prefix_is_released() -> None:
    matcher = StopMatcher(["END"])
    assert matcher.feed("we E") == "we "  # "E" may start "END": held back
    assert matcher.feed("x") == "Ex"
    assert matcher.flush() == ""
    assert not matcher.stopped


def test_the_earliest_of_several_stop_strings_wins() -> None:
    matcher = StopMatcher(["bb", "a"])
    assert _feed_all(matcher, ["xxb", "ba"]) == "xx"


def test_without_stop_strings_nothing_is_held() -> None:
    matcher = StopMatcher([])
    assert matcher.feed("abc") == "abc"


def test_incremental_decoding_equals_decoding_everything(tiny_models: TinyModels) -> None:
    tok = HFTokenizer(tiny_models.target)
    text = "speculative décodage 🚀 with ünïcode and the draft model ✓"
    ids = tok.encode(text, add_special_tokens=False)
    decoder = IncrementalDecoder(tok)
    pieces = [decoder.feed([t]) for t in ids]
    pieces.append(decoder.flush())
    assert "".join(pieces) == tok.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)  # split multi-byte characters are held, not mangled


def test_memoised_single_tokens_decode_what_the_tokenizer_decodes(tiny_models: TinyModels) -> None:
    tok = HFTokenizer(tiny_models.target)
    text = "speculative décodage 🚀 with ünïcode and the draft model ✓"
    ids = tok.encode(text, add_special_tokens=False)
    singles: dict[int, str] = {}
    for _ in range(2):  # the second stream finds every single token memoised by the first
        decoder = IncrementalDecoder(tok, singles)
        pieces = [decoder.feed([t]) for t in ids]
        pieces.append(decoder.flush())
        assert "".join(pieces) == text
    assert singles == {t: tok.decode([t]) for t in singles}
    assert singles  # the windows of one token (all but those after a split character) were memoised


def test_memoised_pairs_give_the_deltas_of_decoding_without_memos(tiny_models: TinyModels) -> None:
    tok = HFTokenizer(tiny_models.target)
    texts = [
        "speculative décodage 🚀 with ünïcode and the draft model ✓",
        "the draft model ✓ and 🚀🚀 speculative décodage, again and again",
        "ünïcode 🚀 the the the draft draft ✓✓",
    ]
    singles: dict[int, str] = {}
    pairs: dict[tuple[int, int], str] = {}
    for _ in range(2):  # the second round finds the pairs memoised by the first
        for text in texts:
            ids = tok.encode(text, add_special_tokens=False)
            plain, memoised = IncrementalDecoder(tok), IncrementalDecoder(tok, singles, pairs=pairs)
            # one token per feed (where the memo applies) mixed with several per feed (where it does not)
            steps: list[list[int]] = []
            at = 0
            while at < len(ids):
                n = 1 if at % 5 else 3
                steps.append(ids[at : at + n])
                at += n
            assert [memoised.feed(s) for s in steps] == [plain.feed(s) for s in steps]
            assert memoised.flush() == plain.flush()
    assert pairs  # pairs of one-token windows were memoised
    for (a, b), delta in pairs.items():
        assert delta == tok.decode([a, b])[len(tok.decode([a])) :]
