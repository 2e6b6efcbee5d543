"""Speculative decoding must not change greedy output: reference backend vs transformers generate()."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.backends.reference import ReferenceDraftExecutor, ReferenceTargetExecutor
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.drafters import DraftModelDrafter
from specdeploy_server.core.scheduler import GlobalStats
from specdeploy_server.core.types import SamplingParams
from specdeploy_server.engine import Engine
from specdeploy_testkit import sample_text

from tests.server.conftest import TinyModels, hf_greedy_outputs

MAX_TOKENS = 24
PROMPTS = sample_text.prompts(50, seed=7)


@pytest.fixture(scope="module")
def hf_greedy(tiny_models: TinyModels) -> list[list[int]]:
    """What transformers' own generate() produces for the target, prompt by prompt."""
    return hf_greedy_outputs(tiny_models.target, PROMPTS, MAX_TOKENS)


def _run(config: dict[str, Any]) -> tuple[list[list[int]], GlobalStats]:
    async def main() -> tuple[list[list[int]], GlobalStats]:
        engine = build_engine(ServerConfig.model_validate(config))
        await engine.start()

        async def one(prompt: str) -> list[int]:
            gen = engine.generate(
                engine.tokenizer.encode(prompt), MAX_TOKENS, SamplingParams(temperature=0.0)
            )
            return [t async for out in gen.outputs for t in out.token_ids]

        outputs = await asyncio.gather(*(one(p) for p in PROMPTS))
        await engine.stop(5)
        return list(outputs), engine.stats

    return asyncio.run(main())


def _config(target: Path, draft: Path | None, **speculative: Any) -> dict[str, Any]:
    model: dict[str, Any] = {"target": str(target)}
    if draft is not None:
        model["draft"] = str(draft)
    return {"model": model, "speculative": speculative, "placement": {"device": "cpu"}}


def test_plain_decoding_through_the_speculative_path_equals_transformers_generate(
    tiny_models: TinyModels, hf_greedy: list[list[int]]
) -> None:
    outputs, stats = _run(_config(tiny_models.target, None, method="none"))
    assert outputs == hf_greedy
    assert stats.drafted == 0
    assert stats.emitted == stats.sequence_steps  # one token per step


@pytest.mark.parametrize("draft_len", [1, 3, 5])
def test_an_unrelated_draft_model_changes_nothing_and_is_mostly_rejected(
    tiny_models: TinyModels, hf_greedy: list[list[int]], draft_len: int
) -> None:
    outputs, stats = _run(_config(tiny_models.target, tiny_models.draft_unrelated, draftLen=draft_len))
    assert outputs == hf_greedy
    assert stats.drafted > 0
    assert stats.accepted / stats.drafted < 0.2


@pytest.mark.parametrize("draft_len", [2, 4, 7])
def test_a_draft_identical_to_the_target_has_every_token_accepted(
    tiny_models: TinyModels, hf_greedy: list[list[int]], draft_len: int
) -> None:
    outputs, stats = _run(_config(tiny_models.target, tiny_models.draft_same, draftLen=draft_len))
    assert outputs == hf_greedy
    assert stats.drafted > 0
    assert stats.accepted == stats.drafted
    # k accepted + 1 bonus per step, except where max_tokens clamps the last step
    assert stats.sequence_steps <= len(PROMPTS) * -(-MAX_TOKENS // (draft_len + 1)) + len(PROMPTS)


@pytest.mark.parametrize(("draft_len", "ngram"), [(2, 1), (4, 2), (6, 3)])
def test_prompt_lookup_changes_nothing(
    tiny_models: TinyModels, hf_greedy: list[list[int]], draft_len: int, ngram: int
) -> None:
    config = _config(
        tiny_models.target,
        None,
        method="promptLookup",
        draftLen=draft_len,
        promptLookup={"maxMatchingNgramSize": ngram},
    )
    outputs, stats = _run(config)
    assert outputs == hf_greedy
    assert stats.drafted > 0


def test_adaptive_draft_len_changes_nothing(tiny_models: TinyModels, hf_greedy: list[list[int]]) -> None:
    outputs, _ = _run(_config(tiny_models.target, tiny_models.draft_unrelated, draftLen="auto"))
    assert outputs == hf_greedy


def test_finished_requests_leave_no_kv_cache_behind(tiny_models: TinyModels) -> None:
    async def main() -> None:
        engine = build_engine(
            ServerConfig.model_validate(_config(tiny_models.target, tiny_models.draft_unrelated))
        )
        assert isinstance(engine, Engine)
        await engine.start()
        gen = engine.generate(engine.tokenizer.encode(PROMPTS[0]), 8, SamplingParams(temperature=0.0))
        assert len([out async for out in gen.outputs]) > 0
        target, drafter = engine.scheduler.target, engine.scheduler.drafter
        assert isinstance(target, ReferenceTargetExecutor)
        assert isinstance(drafter, DraftModelDrafter)
        assert isinstance(drafter.executor, ReferenceDraftExecutor)
        # released between steps, on the backend's worker thread: done once the engine has stopped
        await engine.stop(5)
        assert target.model._kv == {}
        assert drafter.executor.model._kv == {}

    asyncio.run(main())
