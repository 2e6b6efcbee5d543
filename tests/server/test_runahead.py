"""Run-ahead (backends/runahead.py): a lone greedy request's next forward pass made before it is asked for
changes no token, is used (prompt lookup), and stops where it does not pay."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.backends.runahead import MAX_FIRST_MATCH, RunAhead
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.executors import AcceptanceRule, VerifyRequest
from specdeploy_server.core.types import Proposal, SamplingParams, SequenceState
from specdeploy_server.engine import Engine
from specdeploy_testkit import sample_text

from tests.server.conftest import TinyModels, hf_greedy_outputs

MAX_TOKENS = 24
PROMPTS = sample_text.prompts(10, seed=5)


@pytest.fixture(scope="module")
def hf_greedy(tiny_models: TinyModels) -> list[list[int]]:
    return hf_greedy_outputs(tiny_models.target, PROMPTS, MAX_TOKENS)


def _one_at_a_time(target: Path, draft: Path | None, **speculative: Any) -> tuple[list[list[int]], Any]:
    model: dict[str, Any] = {"target": str(target)}
    if draft is not None:
        model["draft"] = str(draft)
    config = {"model": model, "speculative": speculative, "placement": {"device": "cpu"}}

    async def main() -> tuple[list[list[int]], Any]:
        engine = build_engine(ServerConfig.model_validate(config))
        assert isinstance(engine, Engine)
        await engine.start()
        outputs = []
        for prompt in PROMPTS:
            ids = engine.tokenizer.encode(prompt)
            gen = engine.generate(ids, MAX_TOKENS, SamplingParams(temperature=0.0))
            outputs.append([t async for out in gen.outputs for t in out.token_ids])
        await engine.stop(5)
        return outputs, getattr(engine.scheduler.target, "run_ahead", None)

    return asyncio.run(main())


def test_plain_decoding_and_a_draft_model_run_without_run_ahead(
    tiny_models: TinyModels, hf_greedy: list[list[int]]
) -> None:
    for draft, speculative in ((None, {"method": "none"}), (tiny_models.draft_same, {"draftLen": 3})):
        outputs, ahead = _one_at_a_time(tiny_models.target, draft, **speculative)
        assert outputs == hf_greedy
        assert ahead is None


@pytest.mark.parametrize("ngram", [1, 3])
def test_prompt_lookup_run_ahead_equals_transformers_generate(
    tiny_models: TinyModels, hf_greedy: list[list[int]], ngram: int
) -> None:
    lookup = {"maxMatchingNgramSize": ngram}
    outputs, ahead = _one_at_a_time(
        tiny_models.target, None, method="promptLookup", draftLen=4, promptLookup=lookup
    )
    assert outputs == hf_greedy
    assert isinstance(ahead, RunAhead)
    assert ahead.used > 0
    assert ahead.used <= ahead.passes <= sum(len(out) for out in outputs)


def _request(draft: list[int]) -> VerifyRequest:
    seq = SequenceState(request_id="r", prompt_ids=[1, 2, 3], max_tokens=100)
    return VerifyRequest(seq, Proposal(draft), AcceptanceRule.TOKEN_MATCH)


def test_proposals_that_begin_with_the_targets_token_stop_the_run_ahead() -> None:
    ahead = RunAhead(model=None)  # type: ignore[arg-type]  # plan() touches no model
    assert ahead.plan(_request([7, 8]), [9]) == [1, 2, 3, 9]  # rejected at once: worth running ahead
    assert ahead.plan(_request([]), [9]) is not None  # no proposal: nothing learned, still worth it
    planned = [ahead.plan(_request([7, 8]), [7, 8, 5]) for _ in range(10)]  # each proposal begins right
    stopped = planned.index(None)
    assert 0 < stopped <= 3  # the moving average passes MAX_FIRST_MATCH within a few such steps
    assert all(p is None for p in planned[stopped:])
    assert MAX_FIRST_MATCH < 1
    for _ in range(40):  # proposals rejected at once again: running ahead resumes
        ahead.plan(_request([7, 8]), [9])
    assert ahead.plan(_request([7, 8]), [9]) is not None


def test_no_run_ahead_past_the_budget_or_a_stop_token() -> None:
    ahead = RunAhead(model=None)  # type: ignore[arg-type]
    seq = SequenceState(request_id="r", prompt_ids=[1], max_tokens=2, stop_token_ids=frozenset({0}))
    assert ahead.plan(VerifyRequest(seq, Proposal([]), AcceptanceRule.TOKEN_MATCH), [4, 5]) is None
    assert ahead.plan(VerifyRequest(seq, Proposal([]), AcceptanceRule.TOKEN_MATCH), [0]) is None
    assert ahead.plan(VerifyRequest(seq, Proposal([]), AcceptanceRule.TOKEN_MATCH), [4]) == [1, 4]
