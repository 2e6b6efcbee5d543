"""A prediction is a draft with a point-mass proposal: sampled output keeps the target's distribution
(chi-square against the exact distribution, as test_sampling_distribution.py does without predictions)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import torch
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.logits import process_logits
from specdeploy_server.core.types import RequestSpeculation, SamplingParams
from transformers import AutoModelForCausalLM

from tests.server.conftest import TinyModels
from tests.server.test_sampling_distribution import PROMPT, _pooled_chi_square

SAMPLES = 2000
PARAMS = SamplingParams(temperature=0.6, top_p=0.95)


def _exact_first_two(
    target: Any, prompt_ids: list[int], eos: frozenset[int]
) -> tuple[np.ndarray, np.ndarray]:
    model: Any = AutoModelForCausalLM.from_pretrained(str(target), local_files_only=True)
    model.eval()
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids])).logits[0, -1].double().numpy()
        p1 = process_logits(logits, PARAMS)
        support = np.array([x for x in np.flatnonzero(p1) if int(x) not in eos])
        rows = model(torch.tensor([[*prompt_ids, int(x)] for x in support])).logits[:, -1].double().numpy()
        p2 = (p1[support, None] * process_logits(rows, PARAMS)).sum(axis=0)
    return p1, p2 / p2.sum()


def test_sampling_with_a_prediction_follows_the_target_distribution(tiny_models: TinyModels) -> None:
    config = {
        "model": {"target": str(tiny_models.target), "draft": str(tiny_models.draft_unrelated)},
        "speculative": {"acceptance": "logits", "draftLen": 3},
        "placement": {"device": "cpu"},
        "runtime": {"maxQueueSize": None, "maxBatchSize": 128},
    }

    async def sample() -> tuple[list[list[int]], list[int], frozenset[int], int, int]:
        engine = build_engine(ServerConfig.model_validate(config))
        await engine.start()
        prompt_ids = engine.tokenizer.encode(PROMPT)
        greedy = engine.generate(prompt_ids, 4, SamplingParams(temperature=0.0))
        likely = tuple([t async for out in greedy.outputs for t in out.token_ids])

        async def one(seed: int) -> tuple[list[int], int, int]:
            # every other request predicts the likely continuation (the rest draft with the draft model, in
            # the same batches)
            speculation = RequestSpeculation(likely if seed % 2 else ())
            gen = engine.generate(
                prompt_ids, 2, dataclasses.replace(PARAMS, seed=seed), speculation=speculation
            )
            tokens = [t async for out in gen.outputs for t in out.token_ids]
            return tokens, gen.stats.prediction_drafted, gen.stats.prediction_accepted

        results = await asyncio.gather(*(one(seed) for seed in range(SAMPLES)))
        await engine.stop(5)
        drafted = sum(r[1] for r in results)
        accepted = sum(r[2] for r in results)
        return [r[0] for r in results], prompt_ids, engine.tokenizer.eos_token_ids, drafted, accepted

    outputs, prompt_ids, eos, drafted, accepted = asyncio.run(sample())
    assert all(len(o) == 2 or (len(o) == 1 and o[0] in eos) for o in outputs)
    assert 0 < accepted < drafted  # the prediction was both accepted and rejected
    p1, p2 = _exact_first_two(tiny_models.target, prompt_ids, eos)
    vocab = len(p1)
    for half in (0, 1):  # with and without a prediction, each on its own
        mine = outputs[half::2]
        first = np.bincount([o[0] for o in mine], minlength=vocab).astype(float)
        second = np.bincount([o[1] for o in mine if len(o) == 2], minlength=vocab).astype(float)
        assert _pooled_chi_square(first, p1) > 1e-3, half
        assert _pooled_chi_square(second, p2) > 1e-3, half
