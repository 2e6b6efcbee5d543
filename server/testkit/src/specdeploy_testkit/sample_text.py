"""Deterministic pseudo-text for tests and benchmarks: the corpus the tiny tokenizer is trained on, and
prompts drawn from it."""

from __future__ import annotations

import random

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
