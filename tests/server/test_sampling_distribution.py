"""With sampling and rejection-sampling acceptance, the output distribution is the target's (chi-square)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import numpy as np
import torch
from scipy import stats  # type: ignore[import-untyped]
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.logits import process_logits
from specdeploy_server.core.types import SamplingParams
from specdeploy_server.grammar import GrammarCompiler
from specdeploy_server.tokenizer import HFTokenizer
from transformers import AutoModelForCausalLM

from tests.server.conftest import TinyModels
from tests.server.plain_decoding import Penalties, PlainDecoder, _penalised

PROMPT = "the draft model"
SAMPLES = 2000
PARAMS = SamplingParams(temperature=0.6, top_p=0.95)


def _pooled_chi_square(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Chi-square p-value, pooling the categories with small expected counts into one bin."""
    expected = probs * counts.sum()
    big = expected >= min_expected
    obs = np.append(counts[big], counts[~big].sum())
    exp = np.append(expected[big], expected[~big].sum())
    if exp[-1] == 0:
        assert obs[-1] == 0, "sampled a token the target gives zero probability"
        obs, exp = obs[:-1], exp[:-1]
    return float(stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue)


def test_first_two_tokens_follow_the_target_distribution(tiny_models: TinyModels) -> None:
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

        async def one(seed: int) -> list[int]:
            gen = engine.generate(prompt_ids, 2, dataclasses.replace(PARAMS, seed=seed))
            return [t async for out in gen.outputs for t in out.token_ids]

        outs = await asyncio.gather(*(one(seed) for seed in range(SAMPLES)))
        await engine.stop(5)
        eos = engine.tokenizer.eos_token_ids
        return list(outs), prompt_ids, eos, engine.stats.drafted, engine.stats.accepted

    outputs, prompt_ids, eos, drafted, accepted = asyncio.run(sample())
    # a request stops after one token only if that token is end-of-sequence
    assert all(len(o) == 2 or (len(o) == 1 and o[0] in eos) for o in outputs)
    assert drafted > 0
    assert 0 < accepted < drafted  # both branches of the rule were exercised

    # exact target distributions: p(x1 | prompt), and p(x2) = sum_x1 p(x1) p(x2 | prompt, x1) over the x1
    # that do not end the sequence (renormalised: those are the requests that have a second token)
    model: Any = AutoModelForCausalLM.from_pretrained(str(tiny_models.target), local_files_only=True)
    model.eval()
    params = PARAMS
    with torch.inference_mode():
        logits = model(torch.tensor([prompt_ids])).logits[0, -1].double().numpy()
        p1 = process_logits(logits, params)
        support = np.array([x for x in np.flatnonzero(p1) if int(x) not in eos])
        batch = torch.tensor([[*prompt_ids, int(x)] for x in support])
        rows = model(batch).logits[:, -1].double().numpy()
        p2 = (p1[support, None] * process_logits(rows, params)).sum(axis=0)
        p2 /= p2.sum()

    vocab = len(p1)
    first = np.bincount([o[0] for o in outputs], minlength=vocab).astype(float)
    second = np.bincount([o[1] for o in outputs if len(o) == 2], minlength=vocab).astype(float)
    assert _pooled_chi_square(first, p1) > 1e-3
    assert _pooled_chi_square(second, p2) > 1e-3


def test_the_same_seed_gives_the_same_sample(tiny_models: TinyModels) -> None:
    config = {
        "model": {"target": str(tiny_models.target), "draft": str(tiny_models.draft_unrelated)},
        "speculative": {"acceptance": "logits"},
        "placement": {"device": "cpu"},
    }

    async def main() -> list[list[int]]:
        engine = build_engine(ServerConfig.model_validate(config))
        await engine.start()
        ids = engine.tokenizer.encode(PROMPT)
        outs = []
        for seed in (11, 11, 12):
            gen = engine.generate(ids, 12, SamplingParams(temperature=1.0, seed=seed))
            outs.append([t async for out in gen.outputs for t in out.token_ids])
        await engine.stop(5)
        return outs

    a, b, c = asyncio.run(main())
    assert a == b
    assert a != c


def _sample_first_two(
    models: TinyModels, params: SamplingParams, response_grammar: str | None = None
) -> tuple[list[list[int]], list[int], int, int, int]:
    """SAMPLES two-token generations with rejection sampling and an unrelated draft (draft tokens the grammar
    forbids are cut before verification): outputs, prompt ids, drafted, accepted, cut-or-rejected."""
    config = {
        "model": {"target": str(models.target), "draft": str(models.draft_unrelated)},
        "speculative": {"acceptance": "logits", "draftLen": 3},
        "placement": {"device": "cpu"},
        "runtime": {"maxQueueSize": None, "maxBatchSize": 128},
    }

    async def sample() -> tuple[list[list[int]], list[int], int, int, int]:
        engine = build_engine(ServerConfig.model_validate(config))
        tokenizer = engine.tokenizer
        assert isinstance(tokenizer, HFTokenizer)
        compiler = GrammarCompiler(tokenizer.hf, engine.info.vocab_size or 0, tokenizer.eos_token_ids)
        await engine.start()
        prompt_ids = engine.tokenizer.encode(PROMPT)

        async def one(seed: int) -> list[int]:
            constraint = compiler.compile(response_grammar) if response_grammar is not None else None
            gen = engine.generate(prompt_ids, 2, dataclasses.replace(params, seed=seed), constraint)
            return [t async for out in gen.outputs for t in out.token_ids]

        outs = await asyncio.gather(*(one(seed) for seed in range(SAMPLES)))
        await engine.stop(5)
        stats = engine.stats
        return list(outs), prompt_ids, stats.drafted, stats.accepted, stats.drafted - stats.accepted

    return asyncio.run(sample())


def test_penalties_bias_and_filters_sample_the_modified_target_distribution(tiny_models: TinyModels) -> None:
    params = SamplingParams(
        temperature=0.8,
        top_k=40,
        min_p=0.02,
        presence_penalty=1.5,
        frequency_penalty=0.5,
        repetition_penalty=1.3,
        logit_bias={20: 2.0, 30: -3.0},
    )
    penalties = Penalties(presence=1.5, frequency=0.5, repetition=1.3, bias={20: 2.0, 30: -3.0})
    outputs, prompt_ids, drafted, accepted, _ = _sample_first_two(tiny_models, params)
    assert all(len(o) == 2 for o in outputs)
    assert 0 < accepted < drafted
    plain = PlainDecoder(tiny_models.target)
    p1 = process_logits(_penalised(plain.logits(prompt_ids), prompt_ids, [], penalties), params)
    support = np.flatnonzero(p1)
    p2 = np.zeros_like(p1)
    for x in support:
        row = _penalised(plain.logits([*prompt_ids, int(x)]), prompt_ids, [int(x)], penalties)
        p2 += p1[x] * process_logits(row, params)
    vocab = len(p1)
    first = np.bincount([o[0] for o in outputs], minlength=vocab).astype(float)
    second = np.bincount([o[1] for o in outputs], minlength=vocab).astype(float)
    assert _pooled_chi_square(first, p1) > 1e-3
    assert _pooled_chi_square(second, p2) > 1e-3
    # the penalties and the bias changed the distribution, far beyond the sampling noise
    unpenalised = process_logits(plain.logits(prompt_ids), params)
    assert np.abs(first / first.sum() - unpenalised).sum() > 0.2


def test_grammar_constrained_sampling_with_cut_draft_tokens_samples_the_masked_distribution(
    tiny_models: TinyModels,
) -> None:
    grammar = GrammarCompiler.from_lark('start: /[a-z]+/ " " /[0-9]+/')
    params = SamplingParams(temperature=1.0)
    outputs, prompt_ids, drafted, _, _ = _sample_first_two(tiny_models, params, grammar)
    assert drafted > 0
    plain = PlainDecoder(tiny_models.target)
    matcher = plain.matcher(grammar)

    def masked(prefix: list[int]) -> np.ndarray:
        assert matcher.consume_tokens(prefix) if prefix else True
        bits = np.unpackbits(np.frombuffer(matcher.compute_bitmask(), dtype=np.uint8), bitorder="little")
        allowed = bits[: plain.vocab].astype(bool)
        if prefix:
            matcher.rollback(len(prefix))
        return process_logits(np.where(allowed, plain.logits([*prompt_ids, *prefix]), -np.inf), params)

    p1 = masked([])
    p2 = sum(p1[x] * masked([int(x)]) for x in np.flatnonzero(p1))
    vocab = len(p1)
    first = np.bincount([o[0] for o in outputs], minlength=vocab).astype(float)
    second = np.bincount([o[1] for o in outputs if len(o) == 2], minlength=vocab).astype(float)
    assert _pooled_chi_square(first, p1) > 1e-3
    assert _pooled_chi_square(second, np.asarray(p2)) > 1e-3


def test_min_tokens_samples_the_target_distribution_with_the_stop_tokens_masked(
    tiny_models: TinyModels,
) -> None:
    """The draft model masks the stop tokens as the target does (its draft distribution is the masked one), so
    rejection sampling stays exact: the first two tokens follow the masked target distribution."""
    plain = PlainDecoder(tiny_models.target)
    prompt_ids = plain.tokenizer.encode(PROMPT)
    likeliest = int(np.argmax(plain.logits(prompt_ids)))
    stops = sorted({likeliest, plain.eos})
    params = SamplingParams(temperature=1.0, min_tokens=2, stop_token_ids=frozenset({likeliest}))
    outputs, sampled_prompt, drafted, accepted, _ = _sample_first_two(tiny_models, params)
    assert sampled_prompt == prompt_ids
    assert all(len(o) == 2 for o in outputs)
    assert not any(t in stops for o in outputs for t in o)
    assert 0 < accepted < drafted

    def masked(ids: list[int]) -> np.ndarray:
        row = plain.logits(ids)
        row[stops] = -np.inf
        return process_logits(row, params)

    p1 = masked(prompt_ids)
    p2 = np.zeros_like(p1)
    for x in np.flatnonzero(p1):
        p2 += p1[x] * masked([*prompt_ids, int(x)])
    vocab = len(p1)
    first = np.bincount([o[0] for o in outputs], minlength=vocab).astype(float)
    second = np.bincount([o[1] for o in outputs], minlength=vocab).astype(float)
    assert _pooled_chi_square(first, p1) > 1e-3
    assert _pooled_chi_square(second, p2) > 1e-3
