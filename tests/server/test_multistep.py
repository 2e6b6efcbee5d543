"""Multi-step decoding (core/multistep.py): a lone plain greedy sequence gets several target tokens per
executor call, within a time budget, never for its first token and never where each token's logits matter;
the output is the same, and the figures count one target step per token."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.multistep import PlainMultiStep
from specdeploy_server.core.types import SamplingParams, SequenceState
from specdeploy_server.engine import Engine
from specdeploy_testkit import sample_text

from tests.server.conftest import TinyModels, hf_greedy_outputs

GREEDY = SamplingParams(temperature=0.0)


def _running(generated: int = 5, max_tokens: int = 100, **params: Any) -> SequenceState:
    seq = SequenceState("r", [1, 2, 3], max_tokens, SamplingParams(**{"temperature": 0.0, **params}))
    seq.token_ids.extend(range(generated))
    seq.num_generated = generated
    return seq


def test_a_lone_greedy_sequence_decodes_as_many_tokens_per_call_as_fit_the_budget() -> None:
    steps = PlainMultiStep(budget_seconds=0.02, max_tokens_per_call=8)
    assert steps.extra([_running()], waiting=0, max_model_len=4096) == 0, "nothing measured yet: one token"
    steps.observe(1, 0.004)
    assert steps.extra([_running()], waiting=0, max_model_len=4096) == 4  # 5 tokens of 4 ms fit in 20 ms
    steps.seconds_per_token = 0.03  # a forward slower than the budget: one token per call, as without it
    assert steps.extra([_running()], waiting=0, max_model_len=4096) == 0
    steps.seconds_per_token = 0.0001
    assert steps.extra([_running()], waiting=0, max_model_len=4096) == 7, "at most max_tokens_per_call"
    assert steps.extra([_running(generated=5, max_tokens=8)], waiting=0, max_model_len=4096) == 2
    assert steps.extra([_running(generated=5)], waiting=0, max_model_len=3 + 5 + 3) == 2


@pytest.mark.parametrize(
    ("why", "batch", "waiting", "seq_params"),
    [
        ("its first token (time to first token)", "first", 0, {}),
        ("a request waits to join", "one", 1, {}),
        ("two sequences share the step", "two", 0, {}),
        ("sampling", "one", 0, {"temperature": 0.7}),
        ("logits processing", "one", 0, {"presence_penalty": 0.5}),
        ("logprobs", "one", 0, {"logprobs": 2}),
    ],
)
def test_no_extra_tokens_where_they_would_cost_latency_or_each_token_matters(
    why: str, batch: str, waiting: int, seq_params: dict[str, Any]
) -> None:
    steps = PlainMultiStep(seconds_per_token=0.001)
    seqs = {
        "first": [_running(generated=0, **seq_params)],
        "one": [_running(**seq_params)],
        "two": [_running(**seq_params), _running(**seq_params)],
    }[batch]
    assert steps.extra(seqs, waiting=waiting, max_model_len=4096) == 0, why


def test_a_lone_plain_request_gets_several_tokens_per_call_the_same_output_and_honest_step_counts(
    tiny_models: TinyModels,
) -> None:
    prompts = sample_text.prompts(3, seed=5)
    reference = hf_greedy_outputs(tiny_models.target, prompts, 40)
    config = {"model": {"target": str(tiny_models.target)}, "placement": {"device": "cpu"}}

    async def main() -> tuple[list[list[int]], int, int, int, list[int]]:
        engine = build_engine(ServerConfig.model_validate(config))
        assert isinstance(engine, Engine)
        await engine.start()
        outputs, sizes = [], []
        for prompt in prompts:  # one at a time: a lone sequence
            gen = engine.generate(engine.tokenizer.encode(prompt), 40, GREEDY)
            tokens: list[int] = []
            async for out in gen.outputs:
                tokens += out.token_ids
                sizes.append(len(out.token_ids))
            outputs.append(tokens)
        stats = engine.stats
        await engine.stop(5)
        return outputs, stats.steps, stats.sequence_steps, stats.emitted, sizes

    outputs, steps, sequence_steps, emitted, sizes = asyncio.run(main())
    assert outputs == reference  # stop tokens and max_tokens included
    assert steps < emitted / 2, "several tokens per executor call"
    assert max(sizes) > 1
    assert sequence_steps == emitted, "each token counts as one target step: tokens per step stays 1"
