"""Backend trtllm-engine through the TensorRT-LLM test double (tests/server/trtllm_double.py), whose executors
run the tiny reference models: greedy equivalence, placement, executor errors, metrics (cancellation:
test_trtllm_engine_cancellation.py)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.engine_config import EngineConfigError
from specdeploy_server.backends.errors import BackendUnavailableError
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.backends.trtllm_executors import RequestFactory, TrtTargetExecutor
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.executors import VerifyRequest
from specdeploy_server.core.scheduler import GlobalStats
from specdeploy_server.core.types import Proposal, SamplingParams, SequenceState
from specdeploy_server.engine import Engine
from specdeploy_testkit import sample_text

from tests.server.conftest import TinyModels, hf_greedy_outputs, run_live
from tests.server.trtllm_double import DoubleState, engines_config, trtllm_double, write_engine

__all__ = ["trtllm_double"]

MAX_TOKENS = 16
PROMPTS = sample_text.prompts(12, seed=11)


@pytest.fixture(scope="module")
def hf_greedy(tiny_models: TinyModels) -> list[list[int]]:
    return hf_greedy_outputs(tiny_models.target, PROMPTS, MAX_TOKENS)


def _run(config: dict[str, Any], prompts: list[str]) -> tuple[list[list[int]], GlobalStats]:
    async def main() -> tuple[list[list[int]], GlobalStats]:
        engine = build_engine(ServerConfig.model_validate(config))
        assert isinstance(engine, Engine)
        await engine.start()

        async def one(prompt: str) -> list[int]:
            gen = engine.generate(
                engine.tokenizer.encode(prompt), MAX_TOKENS, SamplingParams(temperature=0.0)
            )
            return [t async for out in gen.outputs for t in out.token_ids]

        outputs = await asyncio.gather(*(one(p) for p in prompts))
        await engine.stop(5)
        return list(outputs), engine.stats

    return asyncio.run(main())


def test_tensorrt_llm_is_really_absent_here() -> None:
    # The double is installed per test; without it, the import must fail (the tests below rely on it).
    assert importlib.util.find_spec("tensorrt_llm") is None


@pytest.mark.parametrize("draft_len", [1, 4])
def test_paired_executors_reproduce_the_targets_greedy_output_with_an_unrelated_draft(
    tmp_path: Path,
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    hf_greedy: list[list[int]],
    draft_len: int,
) -> None:
    config = engines_config(tmp_path, tiny_models.target, trtllm_double, tiny_models.draft_unrelated)
    config["speculative"] = {"draftLen": draft_len}
    outputs, stats = _run(config, PROMPTS)
    assert outputs == hf_greedy
    assert stats.drafted > 0
    assert stats.accepted < stats.drafted  # an unrelated draft is mostly rejected


def test_an_identical_draft_is_fully_accepted_and_output_is_unchanged(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState, hf_greedy: list[list[int]]
) -> None:
    config = engines_config(tmp_path, tiny_models.target, trtllm_double, tiny_models.draft_same)
    config["speculative"] = {"draftLen": 3}
    outputs, stats = _run(config, PROMPTS)
    assert outputs == hf_greedy
    # Nearly all: the draft scores one token at a time and the target scores the whole draft in one pass, so
    # float rounding can flip an argmax at a near-tie (the target's choice is the one emitted either way).
    assert stats.drafted > 0
    assert stats.accepted >= 0.95 * stats.drafted
    assert stats.sequence_steps < stats.emitted / 3  # about k + 1 = 4 tokens per step


@pytest.mark.parametrize("method", ["promptLookup", "none"])
def test_the_target_engine_alone_reproduces_greedy_output(
    tmp_path: Path,
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    hf_greedy: list[list[int]],
    method: str,
) -> None:
    config = engines_config(tmp_path, tiny_models.target, trtllm_double, None)
    config["speculative"] = {"method": method, "draftLen": 4}
    outputs, stats = _run(config, PROMPTS)
    assert outputs == hf_greedy
    assert len(trtllm_double.executors) == 1
    if method == "none":
        assert stats.drafted == 0


def test_greedy_requests_with_logits_acceptance_still_match_and_draft_logits_are_gathered(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState, hf_greedy: list[list[int]]
) -> None:
    config = engines_config(tmp_path, tiny_models.target, trtllm_double, None, gather_generation_logits=True)
    config["model"]["draft"] = str(
        write_engine(
            tmp_path / "draft",
            tiny_models.draft_unrelated,
            trtllm_double,
            speculative_decoding_mode=1,
            gather_generation_logits=True,
        )
    )
    config["speculative"] = {"draftLen": 3, "acceptance": "logits"}
    outputs, _ = _run(config, PROMPTS[:4])
    assert outputs == hf_greedy[:4]
    target, draft = trtllm_double.executors
    assert draft.config.gather_generation_logits is True
    assert target.config.gather_generation_logits is False


def test_sampled_requests_with_logits_acceptance_pass_draft_logits_to_the_target(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    config = engines_config(tmp_path, tiny_models.target, trtllm_double, None, gather_generation_logits=True)
    config["model"]["draft"] = str(
        write_engine(
            tmp_path / "draft",
            tiny_models.draft_same,
            trtllm_double,
            speculative_decoding_mode=1,
            gather_generation_logits=True,
        )
    )
    config["speculative"] = {"draftLen": 3, "acceptance": "logits"}

    async def main() -> tuple[list[int], GlobalStats]:
        engine = build_engine(ServerConfig.model_validate(config))
        assert isinstance(engine, Engine)
        await engine.start()
        gen = engine.generate(
            engine.tokenizer.encode(PROMPTS[0]), 12, SamplingParams(temperature=0.8, seed=3)
        )
        tokens = [t async for out in gen.outputs for t in out.token_ids]
        await engine.stop(5)
        return tokens, engine.stats

    tokens, stats = asyncio.run(main())
    assert 0 < len(tokens) <= 12
    # Identical draft and target distributions: rejection sampling accepts every draft token.
    assert stats.accepted == stats.drafted > 0


@pytest.mark.parametrize(
    ("placement", "target_tp", "draft_ids"),
    [("colocated", 2, [0]), ("dedicated", 1, [1])],
)
def test_each_executor_runs_in_orchestrator_mode_on_its_own_device_ids(
    *,
    tmp_path: Path,
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    placement: str,
    target_tp: int,
    draft_ids: list[int],
) -> None:
    config = engines_config(
        tmp_path, tiny_models.target, trtllm_double, tiny_models.draft_unrelated, tp_size=target_tp
    )
    target_ids = list(range(target_tp))
    config["placement"] = {"targetDeviceIds": target_ids, "draftDeviceIds": draft_ids}
    config["runtime"] = {"kvCacheFreeGpuMemFraction": 0.5, "draftKvCacheFreeGpuMemFraction": 0.2}
    engine = build_engine(ServerConfig.model_validate(config))
    target, draft = trtllm_double.executors
    for executor, ids, fraction in ((target, target_ids, 0.5), (draft, draft_ids, 0.2)):
        parallel = executor.config.parallel_config
        assert parallel.communication_mode.name == "ORCHESTRATOR"
        assert parallel.orchestrator_config.is_orchestrator is True
        assert parallel.orchestrator_config.worker_executable_path.endswith("tensorrt_llm/bin/executorWorker")
        assert parallel.device_ids == ids
        assert executor.config.kv_cache_config.free_gpu_memory_fraction == fraction
        assert executor.config.kv_cache_config.enable_block_reuse is True
        assert executor.config.max_beam_width == 1
    if placement == "colocated":
        assert set(draft_ids) <= set(target_ids)
    else:
        assert not set(draft_ids) & set(target_ids)
    asyncio.run(engine.stop(1))


def test_runtime_settings_reach_the_executor_config(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    config = engines_config(tmp_path, tiny_models.target, trtllm_double, None, max_batch_size=8)
    config["runtime"] = {
        "maxBatchSize": 64,
        "maxNumTokens": 4096,
        "guaranteedNoEvict": True,
        "enableChunkedContext": False,
        "kvCacheHostMemoryMegabytes": 2,
        "enableBatchSizeTuning": True,
    }
    engine = build_engine(ServerConfig.model_validate(config))
    (executor,) = trtllm_double.executors
    c = executor.config
    assert c.max_batch_size == 8  # capped by the engine's build_config.max_batch_size
    assert c.max_num_tokens == 4096
    assert c.enable_chunked_context is False
    assert c.scheduler_config.capacity_scheduler_policy.name == "GUARANTEED_NO_EVICT"
    assert c.scheduler_config.dynamic_batch_config.enable_batch_size_tuning is True
    assert c.kv_cache_config.host_cache_size == 2 * 1024 * 1024
    assert isinstance(engine, Engine)
    assert engine.scheduler.settings.max_batch_size == 8
    asyncio.run(engine.stop(1))


def test_an_executor_error_becomes_an_openai_error_and_spares_the_other_requests(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    config = engines_config(tmp_path, tiny_models.target, trtllm_double, tiny_models.draft_unrelated)
    poison = "kubernetes operator pod"
    poison_ids: list[int] = []
    trtllm_double.fail_when = lambda request: (
        "CUDA error: an illegal memory access was encountered"
        if poison_ids and request.input_token_ids[: len(poison_ids)] == poison_ids
        else None
    )
    engine = build_engine(ServerConfig.model_validate(config))
    poison_ids.extend(engine.tokenizer.encode(poison))
    app = create_app(engine, served_model_name="tiny")
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=30) as http:
        body = {"model": "tiny", "max_tokens": 6, "temperature": 0}
        bad = http.post("/v1/completions", json={**body, "prompt": poison})
        good = http.post("/v1/completions", json={**body, "prompt": "hello world"})
        with http.stream(
            "POST", "/v1/completions", json={**body, "prompt": poison, "stream": True}
        ) as stream:
            events = [line for line in stream.iter_lines() if line.startswith("data: ")]
        metrics = http.get("/metrics").text
    assert bad.status_code == 500
    error = bad.json()["error"]
    assert error["type"] == "server_error"
    assert error["code"] == "executor_error"
    assert "illegal memory access" in error["message"]
    assert "draft executor" in error["message"]
    assert good.status_code == 200
    assert good.json()["usage"]["completion_tokens"] == 6
    in_band = json.loads(events[-2].removeprefix("data: "))
    assert in_band["error"]["code"] == "executor_error"
    assert events[-1] == "data: [DONE]"
    assert 'specdeploy_executor_active_requests{executor="target",model="tiny"}' in metrics
    assert 'specdeploy_executor_kv_cache_blocks{executor="draft",model="tiny",state="used"}' in metrics


def test_acceptance_from_our_loop_is_exported_as_metrics(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    config = engines_config(tmp_path, tiny_models.target, trtllm_double, tiny_models.draft_same)
    config["speculative"] = {"draftLen": 2}
    app = create_app(build_engine(ServerConfig.model_validate(config)), served_model_name="tiny")
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=30) as http:
        done = http.post(
            "/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 8, "temperature": 0}
        )
        metrics = http.get("/metrics").text
    assert done.status_code == 200
    spec = done.json()["speculative"]
    assert spec["accepted_draft_tokens"] == spec["draft_tokens"] > 0
    line = next(m for m in metrics.splitlines() if m.startswith("specdeploy_accepted_draft_tokens_total"))
    assert float(line.rsplit(" ", 1)[1]) == spec["accepted_draft_tokens"]


def test_a_verified_chunk_ends_at_the_end_token(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState, hf_greedy: list[list[int]]
) -> None:
    config = engines_config(tmp_path, tiny_models.target, trtllm_double, None)
    engine = build_engine(ServerConfig.model_validate(config))
    assert isinstance(engine, Engine)
    first = hf_greedy[0]
    executor = engine.scheduler.target
    assert isinstance(executor, TrtTargetExecutor)
    # Pretend the target's second greedy token is the end token: the target stops there.
    ending = TrtTargetExecutor(
        executor.client, RequestFactory(executor.requests.bindings, end_id=first[1], pad_id=0), 10
    )
    seq = SequenceState("r1", engine.tokenizer.encode(PROMPTS[0]), 16, SamplingParams(temperature=0.0))

    async def main() -> list[list[int]]:
        return await ending.verify([VerifyRequest(seq, Proposal(first[:3]), "tokenMatch")])

    assert asyncio.run(main()) == [first[:2]]
    asyncio.run(engine.stop(1))


def test_without_tensorrt_llm_a_good_engine_is_one_clear_error(
    tmp_path: Path, tiny_models: TinyModels
) -> None:
    state = DoubleState()
    config = engines_config(tmp_path, tiny_models.target, state, tiny_models.draft_unrelated)
    with pytest.raises(
        BackendUnavailableError, match=r"backend trtllm-engine needs TensorRT-LLM.*Dockerfile.server"
    ):
        build_engine(ServerConfig.model_validate(config))


def test_acceptance_is_counted_by_prefix_match_whatever_the_target_returns(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState, hf_greedy: list[list[int]]
) -> None:
    """A target that keeps decoding up to max_tokens = k + 1 after a rejection returns k + 1 tokens every
    step; only the prefix that matches the draft is accepted, and only accepted + 1 tokens are a step's
    output: the same steps and counts as a target that stops after its own token."""
    config = engines_config(tmp_path, tiny_models.target, trtllm_double, tiny_models.draft_unrelated)
    config["speculative"] = {"draftLen": 4}
    _, exact = _run(config, PROMPTS[:6])
    trtllm_double.continue_after_verify = True
    outputs, stats = _run(config, PROMPTS[:6])
    assert outputs == hf_greedy[:6]
    assert stats.accepted < stats.drafted  # "returned - 1" would make every draft token accepted
    assert (stats.drafted, stats.accepted, stats.sequence_steps) == (
        exact.drafted,
        exact.accepted,
        exact.sequence_steps,
    )


def _logits_config(tmp_path: Path, models: TinyModels, state: DoubleState, draft_tp: int) -> dict[str, Any]:
    """Logits acceptance with a draft built for ``draft_tp`` GPUs: vocab 384 pads to 385 at tp 5."""
    config = engines_config(tmp_path, models.target, state, None, gather_generation_logits=True)
    config["model"]["draft"] = str(
        write_engine(
            tmp_path / "draft",
            models.draft_same,
            state,
            speculative_decoding_mode=1,
            gather_generation_logits=True,
            tp_size=draft_tp,
        )
    )
    config["speculative"] = {"draftLen": 3, "acceptance": "logits"}
    config["placement"] = {"targetDeviceIds": [0], "draftDeviceIds": list(range(1, draft_tp + 1))}
    return config


def test_draft_logits_wider_than_the_targets_vocabulary_are_cut_to_its_width(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    config = _logits_config(tmp_path, tiny_models, trtllm_double, draft_tp=5)

    async def main() -> GlobalStats:
        engine = build_engine(ServerConfig.model_validate(config))
        assert isinstance(engine, Engine)
        await engine.start()
        gen = engine.generate(
            engine.tokenizer.encode(PROMPTS[0]), 12, SamplingParams(temperature=0.8, seed=3)
        )
        assert [t async for out in gen.outputs for t in out.token_ids]
        await engine.stop(5)
        return engine.stats

    stats = asyncio.run(main())
    target, draft = trtllm_double.executors
    assert (draft.vocab_size_padded, target.vocab_size_padded) == (385, 384)
    assert (
        stats.accepted == stats.drafted > 0
    )  # the target took the draft's logits (it refuses a wrong width)


def test_draft_logits_narrower_than_the_targets_are_refused_at_start_up(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    config = _logits_config(tmp_path, tiny_models, trtllm_double, draft_tp=1)
    config["model"]["target"] = str(
        write_engine(
            tmp_path / "target5", tiny_models.target, trtllm_double, gather_generation_logits=True, tp_size=5
        )
    )
    config["placement"] = {"targetDeviceIds": [0, 1, 2, 3, 4], "draftDeviceIds": [5]}
    with pytest.raises(EngineConfigError, match=r"logits are 384 wide .* the target takes 385"):
        build_engine(ServerConfig.model_validate(config))
    config["speculative"]["acceptance"] = "tokenMatch"  # token match hands over no logits
    asyncio.run(build_engine(ServerConfig.model_validate(config)).stop(1))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("frequency_penalty", 0.5),
        ("min_p", 0.1),
        ("logprobs", 0),
        (
            "response_format",
            {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
        ),
    ],
)
def test_fields_the_engine_backend_does_not_apply_are_refused_naming_it(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState, field: str, value: object
) -> None:
    config = engines_config(tmp_path, tiny_models.target, trtllm_double, tiny_models.draft_same)
    app = create_app(build_engine(ServerConfig.model_validate(config)), served_model_name="tiny")
    body = {"model": "tiny", "prompt": PROMPTS[0], "max_tokens": 4, field: value}
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=30) as http:
        refused = http.post("/v1/completions", json=body)
        echoed = http.post(
            "/v1/completions", json={**body, field: None, "n": 2, "echo": True, "temperature": 0}
        )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == field
    assert "backend (trtllm-engine)" in refused.json()["error"]["message"]
    assert echoed.status_code == 200, echoed.text
    texts = [c["text"] for c in echoed.json()["choices"]]
    assert texts[0] == texts[1]
    assert texts[0].startswith(PROMPTS[0])
