"""The reference backend's padded batches: several requests in one forward pass compute what each computes
alone, and each request's cache afterwards holds exactly its own sequence (so rollback keeps working)."""

from __future__ import annotations

import asyncio
import inspect
import warnings
from typing import Any

import pytest
import torch
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.backends.kvbatch import CachedModel, PaddedBatch
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.types import SamplingParams
from specdeploy_server.engine import Engine
from specdeploy_testkit import sample_text

from tests.server.conftest import TinyModels, hf_greedy_outputs

CPU = torch.device("cpu")
# fp32 sums in a different order (a longer, padded attention row; a matrix product over more rows) differ in
# the last bits; nothing more may differ
TOLERANCE = 1e-4


def _alone(path: Any, prefix: list[int], extra: list[int]) -> torch.Tensor:
    return CachedModel(path, CPU, torch.float32).logits_for("alone", prefix, extra)


def test_rows_of_different_lengths_get_the_logits_they_get_alone(tiny_models: TinyModels) -> None:
    model = CachedModel(tiny_models.target, CPU, torch.float32)
    rows = [
        ("a", list(range(3, 40)), [7, 8, 9]),
        ("b", list(range(50, 60)), []),
        ("c", list(range(100, 170)), [11]),
    ]
    model.logits_rows([(rid, prefix[:-5], []) for rid, prefix, _ in rows])  # caches of different lengths
    batched = model.logits_rows(rows)
    for (_, prefix, extra), logits in zip(rows, batched, strict=True):
        assert logits.shape == (len(extra) + 1, model.vocab_size)
        torch.testing.assert_close(logits, _alone(tiny_models.target, prefix, extra), atol=TOLERANCE, rtol=0)
    assert [model.cached_tokens(rid) for rid, _, _ in rows] == [40, 10, 71]


def test_a_rejected_draft_leaves_each_rows_cache_with_its_own_sequence_only(tiny_models: TinyModels) -> None:
    model = CachedModel(tiny_models.target, CPU, torch.float32)
    model.logits_rows([("a", [5, 6, 7, 8], [9, 10, 11]), ("b", [20, 21], [22])])
    # "a" accepted 9 and then got 30 instead of 10; "b" accepted everything and got 23
    batched = model.logits_rows([("a", [5, 6, 7, 8, 9, 30], [31]), ("b", [20, 21, 22, 23], [24, 25])])
    torch.testing.assert_close(
        batched[0], _alone(tiny_models.target, [5, 6, 7, 8, 9, 30], [31]), atol=TOLERANCE, rtol=0
    )
    torch.testing.assert_close(
        batched[1], _alone(tiny_models.target, [20, 21, 22, 23], [24, 25]), atol=TOLERANCE, rtol=0
    )
    assert model._kv["a"].tokens == [5, 6, 7, 8, 9, 30, 31]
    assert [model.cached_tokens("a"), model.cached_tokens("b")] == [7, 6]


def test_tokens_fed_one_at_a_time_skip_the_padding_and_rows_that_are_done(tiny_models: TinyModels) -> None:
    model = CachedModel(tiny_models.target, CPU, torch.float32)
    model.logits_rows([("a", list(range(10, 30)), []), ("b", [3, 4], [])])
    batch = PaddedBatch(model, [("a", list(range(10, 33)), 1), ("b", [3, 4, 5], 1)])
    batch.run()
    batch.feed([40, 41])
    last = batch.feed([42, None])  # "b" is done: a padding token is fed for it and not kept
    batch.commit()
    torch.testing.assert_close(
        last[0], _alone(tiny_models.target, [*range(10, 33), 40, 42], [])[-1], atol=TOLERANCE, rtol=0
    )
    assert model._kv["b"].tokens == [3, 4, 5, 41]
    assert model.cached_tokens("b") == 4
    # the next pass continues from exactly those caches
    after = model.logits_rows([("b", [3, 4, 5, 41], [50])])[0]
    torch.testing.assert_close(after, _alone(tiny_models.target, [3, 4, 5, 41], [50]), atol=TOLERANCE, rtol=0)


def test_a_new_prompt_beside_running_rows_is_caught_up_in_its_own_pass_not_padded_into_theirs(
    tiny_models: TinyModels,
) -> None:
    model = CachedModel(tiny_models.target, CPU, torch.float32)
    model.logits_rows([("a", list(range(10, 30)), []), ("b", [3, 4, 5, 6], [])])
    widths: list[tuple[int, int]] = []
    model.model.register_forward_hook(
        lambda _module, args, kwargs, _out: widths.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    prompt = list(range(100, 140))
    batch = PaddedBatch(model, [("a", list(range(10, 33)), 1), ("new", prompt, 1), ("b", [3, 4, 5, 6, 7], 1)])
    first = batch.run()
    last = batch.feed([40, 41, 42])
    batch.commit()
    # the prompt alone (all but its last position), then all three rows 3 tokens wide, then the fed token
    assert widths == [(1, 39), (3, 3), (3, 1)]
    torch.testing.assert_close(first[1], _alone(tiny_models.target, prompt, [])[-1:], atol=TOLERANCE, rtol=0)
    torch.testing.assert_close(
        last[1], _alone(tiny_models.target, [*prompt, 41], [])[-1], atol=TOLERANCE, rtol=0
    )
    torch.testing.assert_close(
        last[0], _alone(tiny_models.target, [*range(10, 33), 40], [])[-1], atol=TOLERANCE, rtol=0
    )
    assert model._kv["new"].tokens == [*prompt, 41]
    assert [model.cached_tokens(rid) for rid in ("a", "new", "b")] == [24, 41, 6]


def test_new_prompts_that_join_together_share_one_pass(tiny_models: TinyModels) -> None:
    model = CachedModel(tiny_models.target, CPU, torch.float32)
    widths: list[int] = []
    model.model.register_forward_hook(
        lambda _module, args, kwargs, _out: widths.append(kwargs["input_ids"].shape[0]), with_kwargs=True
    )
    model.logits_rows([("x", list(range(10, 40)), []), ("y", list(range(50, 90)), [])])
    assert widths == [2]


def test_batched_passes_record_no_autograd_history_whatever_the_callers_grad_mode(
    tiny_models: TinyModels,
) -> None:
    """The draft runs PaddedBatch itself (not through logits_rows): a pass that recorded history would chain
    every request's cache to the batched caches it was cut from, memory that grows with every step."""
    model = CachedModel(tiny_models.target, CPU, torch.float32)
    with torch.enable_grad():
        for step in range(3):
            batch = PaddedBatch(model, [("a", list(range(10, 20 + step)), 1), ("b", [3, 4, 5 + step], 1)])
            rows = batch.run()
            last = batch.feed([40, 41])
            batch.commit()
            for tensor in (*rows, last):
                assert tensor.grad_fn is None
                assert not tensor.requires_grad
    for request_id in ("a", "b"):
        for layer in model._kv[request_id].cache.layers:
            assert layer.keys.grad_fn is None
            assert layer.values.grad_fn is None


@pytest.mark.parametrize("method", ["draftTarget", "promptLookup", "none"])
def test_requests_in_flight_share_each_forward_pass_and_keep_greedy_output(
    tiny_models: TinyModels, method: str
) -> None:
    prompts = sample_text.prompts(12, seed=3)
    reference = hf_greedy_outputs(tiny_models.target, prompts, 20)
    model: dict[str, Any] = {"target": str(tiny_models.target)}
    if method == "draftTarget":
        model["draft"] = str(tiny_models.draft_same)
    speculative = {"method": method, "draftLen": 3}
    config = {"model": model, "speculative": speculative, "placement": {"device": "cpu"}}

    async def main() -> tuple[list[list[int]], int, int, int]:
        engine = build_engine(ServerConfig.model_validate(config))
        assert isinstance(engine, Engine)
        target: Any = engine.scheduler.target
        forwards = [0]
        target.model.model.register_forward_hook(lambda *_: forwards.__setitem__(0, forwards[0] + 1))
        await engine.start()

        async def one(prompt: str) -> list[int]:
            gen = engine.generate(engine.tokenizer.encode(prompt), 20, SamplingParams(temperature=0.0))
            return [t async for out in gen.outputs for t in out.token_ids]

        outputs = await asyncio.gather(*(one(p) for p in prompts))
        await engine.stop(5)
        return list(outputs), forwards[0], engine.stats.steps, engine.stats.sequence_steps

    outputs, forwards, steps, sequence_steps = asyncio.run(main())
    assert outputs == reference
    # one target forward per step, whatever the number of sequences, plus at most one per prompt that joined
    # running requests (it is caught up in a pass of its own, not padded into theirs)
    assert steps <= forwards <= steps + len(prompts)
    assert sequence_steps > 3 * steps


def test_a_pass_abandoned_before_commit_leaves_nothing_behind(tiny_models: TinyModels) -> None:
    model = CachedModel(tiny_models.target, CPU, torch.float32)
    model.logits_rows([("a", [5, 6, 7, 8], [])])
    abandoned = PaddedBatch(model, [("a", [5, 6, 7, 8, 9, 10], 1)])  # one request: its cache grows in place
    abandoned.run()
    abandoned.feed([11])  # e.g. drafting failed here: no commit
    again = model.logits_rows([("a", [5, 6, 7, 8, 9], [12])])[0]
    torch.testing.assert_close(
        again, _alone(tiny_models.target, [5, 6, 7, 8, 9], [12]), atol=TOLERANCE, rtol=0
    )
    assert model.cached_tokens("a") == len(model._kv["a"].tokens) == 6


def test_the_cache_goes_to_the_model_by_the_keyword_it_declares(tiny_models: TinyModels) -> None:
    """transformers 5.24 renamed ``past_key_values`` to ``cache`` (the old name warns at every call)."""
    model = CachedModel(tiny_models.target, CPU, torch.float32)
    declared = inspect.signature(model.model.forward).parameters
    assert model.cache_kwarg == ("cache" if "cache" in declared else "past_key_values")
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        first = model.logits_for("r", [5, 6, 7], [])
        second = model.logits_for("r", [5, 6, 7, 8], [9])
    assert model.cached_tokens("r") == 5
    torch.testing.assert_close(second, _alone(tiny_models.target, [5, 6, 7, 8], [9]), atol=TOLERANCE, rtol=0)
    assert first.shape[0] == 1


def test_the_reference_backend_tells_draft_len_auto_that_its_rows_are_padded(tiny_models: TinyModels) -> None:
    config = {
        "model": {"target": str(tiny_models.target), "draft": str(tiny_models.draft_same)},
        "speculative": {"method": "draftTarget", "draftLen": "auto"},
        "placement": {"device": "cpu"},
    }
    engine = build_engine(ServerConfig.model_validate(config))
    assert isinstance(engine, Engine)
    assert engine.scheduler.draft_len.padded is True
