"""Tiny Llama-architecture checkpoints for tests and benchmarks (random weights, locally trained tokenizer).

They are written with ``save_pretrained`` and loaded back through the same path a real checkpoint takes, so
nothing is ever downloaded. Needs the ``torch`` extra.
"""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from specdeploy_server.demo_models import bpe_tokenizer

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)

_WORDS = (  # noqa: SIM905
    "the a an speculative decoding draft target model token accept reject sample verify cache kernel batch "
    "queue server request stream latency throughput gpu memory engine tensor prompt lookup ngram chat user "
    "assistant system hello world python rust kubernetes operator pod node replica scale fast slow red green "
    "blue one two three four five six seven eight nine ten and or not if then else for while return def class"
).split()


def corpus(lines: int = 600, seed: int = 0) -> list[str]:
    """Deterministic pseudo-text with repetition (so n-grams recur, as in real prompts)."""
    rng = random.Random(seed)
    out = []
    for i in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        if i % 5 == 0:
            words += words[: rng.randint(2, 5)]
        out.append(" ".join(words) + (f" {i % 97}." if i % 3 == 0 else "."))
    return out


def prompts(count: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    text = corpus(200, seed)
    return [" ".join(rng.sample(text, rng.randint(1, 3))) for _ in range(count)]


def train_tokenizer(directory: Path, vocab_size: int = 384) -> None:
    bpe_tokenizer(corpus(), vocab_size, CHAT_TEMPLATE).save_pretrained(str(directory))


@dataclass(frozen=True)
class TinyLlama:
    hidden_size: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate_size: int = 128
    max_position_embeddings: int = 256
    initializer_range: float = 0.1


def save_tiny_llama(
    directory: Path, tokenizer_dir: Path, seed: int, shape: TinyLlama = TinyLlama(), dtype: str = "float32"
) -> Path:
    """A random-weight Llama checkpoint with ``tokenizer_dir``'s tokenizer copied beside it."""
    directory.mkdir(parents=True, exist_ok=True)
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
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    model.save_pretrained(str(directory))
    for item in tokenizer_dir.iterdir():
        if item.is_file():
            shutil.copy(item, directory / item.name)
    return directory
