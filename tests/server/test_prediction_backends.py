"""Predicted Outputs on the TensorRT-LLM backends, through the test double: trtllm-engine verifies a
prediction's tokens as external draft tokens (our loop), within the engine's max_draft_len; trtllm-llmapi
cannot take a request's own draft tokens and refuses ``prediction`` and ``speculation`` naming the backend."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path
from typing import Any

import openai
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.types import RequestSpeculation, SamplingParams, SeqStats
from specdeploy_server.engine import Engine
from specdeploy_testkit import sample_text

from tests.server.conftest import TinyModels, hf_greedy_outputs, run_live
from tests.server.trtllm_double import DoubleState, trtllm_double, write_engine

__all__ = ["trtllm_double"]

MAX_TOKENS = 24
PROMPTS = sample_text.prompts(6, seed=5)


def _edited(tokens: list[int], kind: int, rng: random.Random) -> tuple[int, ...]:
    at = rng.randrange(1, max(len(tokens) - 1, 2))
    if kind == 0:
        return tuple(tokens)
    if kind == 1:
        return (*tokens[:at], rng.randrange(3, 300), *tokens[at + 1 :])
    if kind == 2:
        return (*tokens[:at], 7, 8, 9, *tokens[at:])
    return tuple(tokens[:at] + tokens[at + 3 :])


def _run_with_predictions(
    config: dict[str, Any], prompts: list[str], predictions: list[tuple[int, ...]], params: SamplingParams
) -> tuple[list[list[int]], list[SeqStats]]:
    async def main() -> tuple[list[list[int]], list[SeqStats]]:
        engine = build_engine(ServerConfig.model_validate(config))
        assert isinstance(engine, Engine)
        await engine.start()

        async def one(prompt: str, prediction: tuple[int, ...]) -> tuple[list[int], SeqStats]:
            ids = engine.tokenizer.encode(prompt)
            gen = engine.generate(ids, MAX_TOKENS, params, speculation=RequestSpeculation(prediction))
            return [t async for out in gen.outputs for t in out.token_ids], gen.stats

        results = await asyncio.gather(*(one(p, q) for p, q in zip(prompts, predictions, strict=True)))
        await engine.stop(5)
        return [r[0] for r in results], [r[1] for r in results]

    return asyncio.run(main())


@pytest.mark.parametrize("draft", [True, False])
def test_trtllm_engine_verifies_predictions_within_the_engines_draft_length(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState, draft: bool
) -> None:
    target = write_engine(tmp_path / "target", tiny_models.target, trtllm_double, max_draft_len=6)
    model: dict[str, Any] = {"target": str(target)}
    if draft:
        model["draft"] = str(
            write_engine(
                tmp_path / "draft", tiny_models.draft_unrelated, trtllm_double, speculative_decoding_mode=1
            )
        )
    config = {
        "model": model,
        "backend": "trtllm-engine",
        "speculative": {"method": "draftTarget" if draft else "none", "draftLen": 3, "maxDraftLen": 6},
    }
    expected = hf_greedy_outputs(tiny_models.target, PROMPTS, MAX_TOKENS)
    rng = random.Random(1)
    predictions = [_edited(out, i % 4, rng) for i, out in enumerate(expected)]
    outputs, stats = _run_with_predictions(config, PROMPTS, predictions, SamplingParams(temperature=0.0))
    assert outputs == expected
    assert all(s.prediction_drafted <= 6 * s.steps for s in stats)  # the engine's max_draft_len (6) holds
    exact = stats[0]
    assert exact.prediction_accepted >= len(expected[0]) - exact.steps - 1
    assert sum(s.prediction_accepted for s in stats) > sum(len(o) for o in outputs) / 2


def test_trtllm_engine_samples_with_predictions_under_logits_acceptance(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    """A prediction has no draft logits: it is verified by token match, which is exact for a point-mass
    proposal, next to draft-model proposals that carry their logits."""
    model = {
        "target": str(
            write_engine(
                tmp_path / "target", tiny_models.target, trtllm_double, gather_generation_logits=True
            )
        ),
        "draft": str(
            write_engine(
                tmp_path / "draft",
                tiny_models.draft_unrelated,
                trtllm_double,
                speculative_decoding_mode=1,
                gather_generation_logits=True,
            )
        ),
    }
    config = {
        "model": model,
        "backend": "trtllm-engine",
        "speculative": {"acceptance": "logits", "draftLen": 3},
    }
    expected = hf_greedy_outputs(tiny_models.target, PROMPTS, MAX_TOKENS)
    predictions = [tuple(out) if i % 2 else () for i, out in enumerate(expected)]
    outputs, stats = _run_with_predictions(
        config, PROMPTS, predictions, SamplingParams(temperature=0.5, seed=3)
    )
    assert all(outputs)
    assert sum(s.prediction_drafted for s in stats) > 0
    assert sum(s.drafted - s.prediction_drafted for s in stats) > 0  # the draft model drafted too


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"prediction": {"type": "content", "content": "the draft"}}, "prediction"),
        ({"speculation": {"enabled": False}}, "speculation"),
        ({"speculation": {"max_draft_tokens": 2}}, "speculation"),
    ],
)
def test_trtllm_llmapi_refuses_predictions_and_speculation_control_naming_the_backend(
    tiny_models: TinyModels, trtllm_double: DoubleState, body: dict[str, Any], param: str
) -> None:
    config = ServerConfig.model_validate(
        {
            "model": {"target": str(tiny_models.target)},
            "backend": "trtllm-llmapi",
            "speculative": {"method": "promptLookup", "draftLen": 4},
        }
    )
    with run_live(create_app(build_engine(config), served_model_name="tiny")) as live:
        client = openai.OpenAI(base_url=f"{live.base_url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="tiny", prompt="draft target", max_tokens=4, extra_body=body)
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["param"] == param
    assert "backend (trtllm-llmapi)" in error["message"]
    assert trtllm_double.llms[0].requests == []
