"""EAGLE-3 through the reference backend's whole loop: exact under greedy, sampling works, nothing is left
behind."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from specdeploy_server.backends.eagle3_drafter import Eagle3DraftExecutor
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.backends.reference import ReferenceTargetExecutor
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.drafters import DraftModelDrafter
from specdeploy_server.core.scheduler import GlobalStats
from specdeploy_server.core.types import SamplingParams
from specdeploy_server.engine import Engine
from specdeploy_testkit import sample_text

from tests.server.conftest import TinyModels, hf_greedy_outputs
from tests.server.modelopt_eagle3 import convert, export

MAX_TOKENS = 20
PROMPTS = sample_text.prompts(24, seed=11)


@pytest.fixture(scope="module")
def head(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return export(convert(tiny_models.target, seed=3), tmp_path_factory.mktemp("eagle3"))


def _config(tiny_models: TinyModels, head: Path, **speculative: Any) -> ServerConfig:
    return ServerConfig.model_validate(
        {
            "backend": "pytorch-reference",
            "model": {"target": str(tiny_models.target), "speculativeModel": str(head)},
            "speculative": {"method": "eagle3", **speculative},
            "placement": {"device": "cpu"},
        }
    )


def _run(config: ServerConfig, params: SamplingParams) -> tuple[list[list[int]], GlobalStats, Engine]:
    async def main() -> tuple[list[list[int]], GlobalStats, Engine]:
        engine = build_engine(config)
        assert isinstance(engine, Engine)
        await engine.start()

        async def one(prompt: str) -> list[int]:
            gen = engine.generate(engine.tokenizer.encode(prompt), MAX_TOKENS, params)
            return [t async for out in gen.outputs for t in out.token_ids]

        outputs = await asyncio.gather(*(one(p) for p in PROMPTS))
        await engine.stop(5)
        return list(outputs), engine.stats, engine

    return asyncio.run(main())


@pytest.mark.parametrize("draft_len", [1, 4, "auto"])
def test_eagle3_changes_nothing_under_greedy_with_requests_in_flight_together(
    tiny_models: TinyModels, head: Path, draft_len: int | str
) -> None:
    outputs, stats, _ = _run(_config(tiny_models, head, draftLen=draft_len), SamplingParams(temperature=0.0))
    assert outputs == hf_greedy_outputs(tiny_models.target, PROMPTS, MAX_TOKENS)
    assert stats.drafted > 0


@pytest.mark.parametrize("acceptance", ["tokenMatch", "logits"])
def test_eagle3_samples_at_temperature_one_and_frees_every_cache(
    tiny_models: TinyModels, head: Path, acceptance: str
) -> None:
    """With `logits` the head's distributions go to rejection sampling (each drafted token comes with the
    distribution it was sampled from)."""
    config = _config(tiny_models, head, draftLen=3, acceptance=acceptance)
    outputs, stats, engine = _run(config, SamplingParams(temperature=1.0, seed=5))
    assert all(outputs)
    assert stats.drafted > 0
    target, drafter = engine.scheduler.target, engine.scheduler.drafter
    assert isinstance(target, ReferenceTargetExecutor)
    assert isinstance(drafter, DraftModelDrafter)
    assert drafter.name == "eagle3"
    assert isinstance(drafter.executor, Eagle3DraftExecutor)
    assert target.model._kv == {}
    assert drafter.executor._caches == {}
