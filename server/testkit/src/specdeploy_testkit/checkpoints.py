"""Tiny Llama-architecture checkpoints for tests and benchmarks (random weights, a tokenizer trained here on
:mod:`specdeploy_testkit.sample_text`).

They are written with ``save_pretrained`` and loaded back through the same path a real checkpoint takes, so
nothing is ever downloaded. Needs the ``torch`` extra.
"""

from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from specdeploy_server.demo_models import bpe_tokenizer
from tokenizers import pre_tokenizers
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specdeploy_testkit.sample_text import corpus

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def train_tokenizer(directory: Path, vocab_size: int = 384, *, padded_to: int | None = None) -> None:
    """A byte-level BPE tokenizer of ``vocab_size`` tokens trained on :func:`corpus`, saved in ``directory``.

    ``padded_to``: the vocabulary is then filled up to that many tokens (a real model's size, e.g. Llama 3's
    128 256, so that its embedding, LM head, logits and grammar masks cost what a real model's do) with
    tokens that encoding never produces (no merge makes them) and that decode to three bytes each."""
    bpe_tokenizer(corpus(), vocab_size, CHAT_TEMPLATE).save_pretrained(str(directory))
    if padded_to is not None:
        pad_vocabulary(directory / "tokenizer.json", padded_to)


def pad_vocabulary(tokenizer_json: Path, size: int) -> None:
    """Fill a saved byte-level BPE tokenizer's vocabulary up to ``size`` ids with three-character tokens of
    the byte-level alphabet that it does not hold (see :func:`train_tokenizer`)."""
    data = json.loads(tokenizer_json.read_text(encoding="utf-8"))
    vocab: dict[str, int] = data["model"]["vocab"]
    taken = len(vocab) + sum(1 for t in data.get("added_tokens", []) if t["content"] not in vocab)
    if size < taken:
        raise ValueError(f"padded_to={size}: the tokenizer already has {taken} tokens")
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    combos = itertools.product(alphabet, repeat=3)
    next_id = max([*vocab.values(), *(t["id"] for t in data.get("added_tokens", []))]) + 1
    while next_id < size:
        token = "".join(next(combos))
        if token not in vocab:
            vocab[token] = next_id
            next_id += 1
    tokenizer_json.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")


@dataclass(frozen=True)
class TinyLlama:
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 256
    initializer_range: float = 0.1


def tiny_llama(
    tokenizer_dir: Path,
    seed: int,
    shape: TinyLlama = TinyLlama(),
    dtype: str = "float32",
    device: str = "cpu",
) -> LlamaForCausalLM:
    """A random-weight Llama of ``shape`` for ``tokenizer_dir``'s tokenizer, its vocabulary as large as that
    tokenizer's, built on ``device`` (initialised in float32, then cast to ``dtype``)."""
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.layers,
        num_attention_heads=shape.heads,
        num_key_value_heads=shape.kv_heads,
        max_position_embeddings=shape.max_position_embeddings,
        initializer_range=shape.initializer_range,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    cast: LlamaForCausalLM = model.to(getattr(torch, dtype))
    return cast


def save_with_tokenizer(model: Any, directory: Path, tokenizer_dir: Path) -> Path:
    """``model`` saved in ``directory`` with ``tokenizer_dir``'s files copied beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(directory))
    for item in tokenizer_dir.iterdir():
        if item.is_file():
            shutil.copy(item, directory / item.name)
    return directory


def save_tiny_llama(
    directory: Path, tokenizer_dir: Path, seed: int, shape: TinyLlama = TinyLlama(), dtype: str = "float32"
) -> Path:
    """A random-weight Llama checkpoint with ``tokenizer_dir``'s tokenizer copied beside it."""
    return save_with_tokenizer(tiny_llama(tokenizer_dir, seed, shape, dtype), directory, tokenizer_dir)


def train_char_tokenizer(directory: Path) -> None:
    """A character-level tokenizer (one token per character of :func:`corpus`, plus ``<s>``, ``</s>`` and
    ``<unk>``) whose decoder is a bare ``Fuse``, saved in ``directory``: a tokenizer a grammar engine that
    needs byte-level or SentencePiece decoding (llguidance) cannot read."""
    from tokenizers import Tokenizer, decoders, models  # noqa: PLC0415
    from transformers import PreTrainedTokenizerFast  # noqa: PLC0415

    specials = ["<unk>", "<s>", "</s>"]
    chars = sorted(set("".join(corpus())))
    vocab = {token: i for i, token in enumerate([*specials, *chars])}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))
