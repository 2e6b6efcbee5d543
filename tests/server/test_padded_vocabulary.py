"""A tokenizer padded to a real model's vocabulary size (``checkpoints.train_tokenizer(padded_to=...)``): as
many ids as asked, text encodes as before, every padding token stands for three bytes of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from specdeploy_testkit import checkpoints, sample_text
from transformers import AutoTokenizer


def test_a_padded_tokenizer_has_the_size_asked_for_and_encodes_text_as_the_unpadded_one(
    tmp_path: Path,
) -> None:
    plain, padded = tmp_path / "plain", tmp_path / "padded"
    plain.mkdir()
    padded.mkdir()
    checkpoints.train_tokenizer(plain)
    checkpoints.train_tokenizer(padded, padded_to=4096)
    small = AutoTokenizer.from_pretrained(str(plain), local_files_only=True)
    large = AutoTokenizer.from_pretrained(str(padded), local_files_only=True)
    assert len(small) == 384
    assert len(large) == 4096
    for text in sample_text.prompts(8):
        assert large.encode(text) == small.encode(text)  # no merge makes a padding token
    added = large.convert_ids_to_tokens(list(range(384, 4096)))
    assert len(set(added)) == len(added)  # three bytes each, no two alike
    assert all(len(token) == 3 for token in added)
    assert all(large.decode([i]) for i in range(384, 4096))
    assert large.eos_token_id == small.eos_token_id


def test_padding_to_fewer_tokens_than_the_tokenizer_has_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="padded_to=100: the tokenizer already has 384 tokens"):
        checkpoints.train_tokenizer(tmp_path, padded_to=100)


def test_padding_keeps_ids_dense(tmp_path: Path) -> None:
    checkpoints.train_tokenizer(tmp_path, padded_to=1000)
    vocab = json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(1000))
