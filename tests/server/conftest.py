"""Fixtures for the server tests: tiny Llama checkpoints built once per session, and live uvicorn servers."""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from specdeploy_testkit import checkpoints
from specdeploy_testkit.checkpoints import TinyLlama

from tests.server.constrained_cases import chat_prompt_ids, plain_constrained_outputs
from tests.server.livethread import LiveServer, run_live
from tests.server.plain_decoding import PlainDecoder

__all__ = ["LiveServer", "TinyModels", "run_live"]

# Tiny models run fastest single-threaded; two threads on two cores mostly contend.
torch.set_num_threads(1)


@dataclass(frozen=True)
class TinyModels:
    tokenizer: Path
    target: Path
    draft_same: Path  # byte-identical copy of the target
    draft_unrelated: Path  # same vocabulary, different random weights and shape


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    root = tmp_path_factory.mktemp("models")
    tokenizer = root / "tokenizer"
    tokenizer.mkdir()
    checkpoints.train_tokenizer(tokenizer)
    target = checkpoints.save_tiny_llama(root / "target", tokenizer, seed=0)
    same = root / "draft-same"
    shutil.copytree(target, same)
    unrelated = checkpoints.save_tiny_llama(
        root / "draft-unrelated",
        tokenizer,
        seed=1,
        shape=TinyLlama(hidden_size=32, layers=1, heads=2, kv_heads=1),
    )
    return TinyModels(tokenizer, target, same, unrelated)


@pytest.fixture(scope="module")
def plain(tiny_models: TinyModels) -> PlainDecoder:
    """Plain (non-speculative) decoding of the tiny target: what every backend's greedy output must equal."""
    return PlainDecoder(tiny_models.target)


@pytest.fixture(scope="session")
def plain_outputs(tiny_models: TinyModels) -> list[str]:
    """Plain constrained greedy decoding of every structured-output schema (constrained_cases.py), computed
    once for every backend's structured-output tests."""
    return plain_constrained_outputs(PlainDecoder(tiny_models.target), chat_prompt_ids(tiny_models.target))


def hf_greedy_outputs(model_dir: Path, prompts: Sequence[str], max_tokens: int) -> list[list[int]]:
    """What transformers' own generate() produces greedily for `model_dir`, prompt by prompt: the reference
    the greedy-equivalence tests compare every backend with."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok: Any = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(str(model_dir), local_files_only=True)
    model.eval()
    out = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = tok(prompt, return_tensors="pt").input_ids
            gen = model.generate(ids, max_new_tokens=max_tokens, do_sample=False)
            out.append(gen[0, ids.shape[1] :].tolist())
    return out
