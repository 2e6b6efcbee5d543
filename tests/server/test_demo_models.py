"""The demo's models: made locally, loadable by the server, and speculative greedy output is transformers'."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file
from specdeploy_server import cli, demo_models
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.scheduler import GlobalStats
from specdeploy_server.core.types import SamplingParams
from specdeploy_server.engine import Engine
from transformers import AutoConfig

from tests.server.conftest import hf_greedy_outputs

STEPS = 40  # a few seconds: enough for the models to say something, far from the demo's default
MAX_TOKENS = 24
PROMPTS = [*demo_models.SAMPLE_PROMPTS, "Question: What is a pod?\nAnswer:", "Kubernetes"]


@dataclass(frozen=True)
class Made:
    root: Path
    summary: dict[str, Any]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Made:
    root = tmp_path_factory.mktemp("demo")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert demo_models.main([str(root), "--steps", str(STEPS), "--seed", "3"]) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 1, lines
    return Made(root, json.loads(lines[0]))


def _generate(config: ServerConfig, prompts: list[str]) -> tuple[list[list[int]], GlobalStats]:
    async def main() -> tuple[list[list[int]], GlobalStats]:
        engine = build_engine(config)
        await engine.start()
        outputs = []
        for prompt in prompts:
            gen = engine.generate(
                engine.tokenizer.encode(prompt), MAX_TOKENS, SamplingParams(temperature=0.0)
            )
            outputs.append([t async for out in gen.outputs for t in out.token_ids])
        await engine.stop(5)
        return outputs, engine.stats

    return asyncio.run(main())


def test_the_cli_writes_both_checkpoints_and_a_one_line_summary(made: Made) -> None:
    summary = made.summary
    assert summary["target"] == str(made.root / "target")
    assert summary["draft"] == str(made.root / "draft")
    assert summary["steps"] == STEPS
    assert summary["seed"] == 3
    assert summary["draftParameters"] < summary["targetParameters"]
    assert 0.0 <= summary["acceptance"] <= 1.0
    assert summary["targetLoss"] > 0
    assert list(summary["samples"]) == list(demo_models.SAMPLE_PROMPTS)
    for name in ("target", "draft"):
        files = {p.name for p in (made.root / name).iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= files


def test_the_draft_shares_the_targets_vocabulary_and_tokenizer(made: Made) -> None:
    target, draft = made.root / "target", made.root / "draft"
    target_config: Any = AutoConfig.from_pretrained(str(target), local_files_only=True)
    draft_config: Any = AutoConfig.from_pretrained(str(draft), local_files_only=True)
    assert draft_config.vocab_size == target_config.vocab_size
    assert draft_config.num_hidden_layers < target_config.num_hidden_layers
    assert (draft / "tokenizer.json").read_bytes() == (target / "tokenizer.json").read_bytes()
    # the draft is cut from the target: same embeddings and first layer
    target_weights = load_file(target / "model.safetensors")
    draft_weights = load_file(draft / "model.safetensors")
    for key in ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"):
        assert draft_weights[key].equal(target_weights[key])


def test_the_server_loads_them_from_its_command_line(made: Made) -> None:
    config = cli.load_config([str(made.root / "target"), str(made.root / "draft"), "--device", "cpu"])
    assert config.method.value == "draftTarget"

    async def main() -> str:
        engine = build_engine(config)
        assert isinstance(engine, Engine)
        await engine.start()
        rendered = engine.tokenizer.render_chat([{"role": "user", "content": "What is a pod?"}])
        await engine.stop(5)
        return rendered

    assert asyncio.run(main()) == "Question: What is a pod?\nAnswer:"


@pytest.mark.parametrize("draft_len", [1, 4])
def test_speculative_greedy_output_equals_transformers_generate(made: Made, draft_len: int) -> None:
    expected = hf_greedy_outputs(made.root / "target", PROMPTS, MAX_TOKENS)
    config = ServerConfig.model_validate(
        {
            "model": {"target": str(made.root / "target"), "draft": str(made.root / "draft")},
            "speculative": {"method": "draftTarget", "draftLen": draft_len},
            "placement": {"device": "cpu"},
        }
    )
    outputs, stats = _generate(config, PROMPTS)
    assert outputs == expected
    assert stats.drafted > 0


def test_the_same_seed_and_steps_give_identical_checkpoints(tmp_path: Path) -> None:
    settings = demo_models.TrainSettings(steps=3, seed=5)
    first = demo_models.build(tmp_path / "a", settings)
    second = demo_models.build(tmp_path / "b", settings)
    for name in ("target", "draft"):
        for file in ("model.safetensors", "tokenizer.json", "config.json"):
            assert (tmp_path / "a" / name / file).read_bytes() == (tmp_path / "b" / name / file).read_bytes()
    assert first.target_loss == second.target_loss
    other = demo_models.build(tmp_path / "c", demo_models.TrainSettings(steps=3, seed=6))
    assert other.target_loss != first.target_loss
    assert (tmp_path / "c" / "target" / "model.safetensors").read_bytes() != (
        tmp_path / "a" / "target" / "model.safetensors"
    ).read_bytes()


def test_the_corpus_ships_with_the_package() -> None:
    text = demo_models.corpus_text()
    assert 4_000 < len(text.encode()) < 64_000
    assert "Speculative decoding" in text
    docs = demo_models.documents(text)
    assert any(doc.startswith("Question: ") and "\nAnswer: " in doc for doc in docs)
