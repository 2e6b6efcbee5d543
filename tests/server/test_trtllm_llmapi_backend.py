"""Backend trtllm-llmapi through the TensorRT-LLM test double: the speculative_config rendered per method, the
LLM's settings, greedy output through the serving layer, disconnects and errors."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.backends.trtllm_llmapi import LlmApiEngine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.scheduler import QueueFullError
from specdeploy_server.core.types import FinishReason, SamplingParams
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.server.conftest import TinyModels, run_live
from tests.server.trtllm_double import DoubleState, trtllm_double

__all__ = ["trtllm_double"]


def _config(models: TinyModels, **speculative: Any) -> dict[str, Any]:
    return {"model": {"target": str(models.target)}, "backend": "trtllm-llmapi", "speculative": speculative}


@pytest.mark.parametrize(
    ("speculative", "extra_model", "kind", "fields"),
    [
        (
            {"method": "eagle3", "maxDraftLen": 3, "draftLen": 3},
            "speculativeModel",
            "Eagle3DecodingConfig",  # 1.2 has both; EagleDecodingConfig is the fallback for 1.0-1.1
            {"max_draft_len": 3},
        ),
        (
            {"method": "promptLookup", "draftLen": 4, "promptLookup": {"maxMatchingNgramSize": 3}},
            None,
            "NGramDecodingConfig",
            {"max_draft_len": 4, "max_matching_ngram_size": 3, "is_public_pool": False},
        ),
        (
            {"method": "draftTarget", "draftLen": 5},
            "draft",
            "DraftTargetDecodingConfig",
            {"max_draft_len": 5},
        ),
        ({"method": "mtp", "draftLen": 2}, None, "MTPDecodingConfig", {"num_nextn_predict_layers": 2}),
        (
            {"method": "draftTarget", "draftLen": "auto", "maxDraftLen": 6, "disableAboveConcurrency": 8},
            "draft",
            "DraftTargetDecodingConfig",
            {
                "max_draft_len": 6,
                "max_concurrency": 8,
                "acceptance_rate_window_size": 128,
                "acceptance_rate_threshold": 0.1,
            },
        ),
        (
            {"method": "promptLookup", "draftLen": "auto"},
            None,
            "AutoDecodingConfig",
            {"max_concurrency": None},
        ),
        (
            {"method": "promptLookup", "draftLen": "auto", "disableAboveConcurrency": 4},
            None,
            "NGramDecodingConfig",
            {"max_draft_len": 10, "max_concurrency": 4, "acceptance_rate_threshold": 0.1},
        ),
        (
            {"method": "draftTarget", "draftLen": 3, "disableAboveConcurrency": 2},
            "draft",
            "DraftTargetDecodingConfig",
            {"max_draft_len": 3, "max_concurrency": 2, "acceptance_rate_window_size": None},
        ),
    ],
    ids=[
        "eagle3",
        "ngram",
        "draft-target",
        "mtp",
        "draft-target-auto",
        "ngram-auto-heuristic",
        "ngram-auto-with-a-ceiling",
        "fixed-with-a-ceiling",
    ],
)
def test_the_speculative_config_is_rendered_from_the_method(
    *,
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    speculative: dict[str, Any],
    extra_model: str | None,
    kind: str,
    fields: dict[str, Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if speculative["method"] == "promptLookup":  # TensorRT-LLM's own NGram: a version without user drafters
        monkeypatch.delattr(sys.modules["tensorrt_llm.llmapi"], "UserProvidedDecodingConfig")
    config = _config(tiny_models, **speculative)
    if extra_model is not None:
        config["model"][extra_model] = str(tiny_models.draft_same)
    build_engine(ServerConfig.model_validate(config))
    (llm,) = trtllm_double.llms
    spec = llm.kwargs["speculative_config"]
    assert type(spec).__name__ == kind
    for key, value in fields.items():
        assert getattr(spec, key) == value
    if extra_model is not None:
        # passed as speculative_model_dir, an alias of the field speculative_model
        assert spec.speculative_model == str(tiny_models.draft_same)
    assert llm.kwargs["disable_overlap_scheduler"] is True


def test_load_aware_fields_a_version_lacks_are_left_out_with_a_warning(
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    llmapi = sys.modules["tensorrt_llm.llmapi"]
    older = dict.fromkeys(("max_draft_len", "speculative_model", "max_matching_ngram_size"))
    monkeypatch.setattr(llmapi.DraftTargetDecodingConfig, "model_fields", older)
    monkeypatch.delattr(llmapi, "AutoDecodingConfig")
    monkeypatch.delattr(llmapi, "UserProvidedDecodingConfig")
    config = _config(tiny_models, method="draftTarget", draftLen="auto", disableAboveConcurrency=4)
    config["model"]["draft"] = str(tiny_models.draft_same)
    build_engine(ServerConfig.model_validate(config))
    spec = trtllm_double.llms[-1].kwargs["speculative_config"]
    assert spec.max_concurrency is None
    assert spec.acceptance_rate_window_size is None
    assert "disableAboveConcurrency is not honoured" in caplog.text
    assert "no acceptance-rate gate" in caplog.text
    build_engine(ServerConfig.model_validate(_config(tiny_models, method="promptLookup", draftLen="auto")))
    assert type(trtllm_double.llms[-1].kwargs["speculative_config"]).__name__ == "NGramDecodingConfig"


def test_the_double_refuses_load_aware_values_the_real_api_refuses(trtllm_double: DoubleState) -> None:
    llmapi = sys.modules["tensorrt_llm.llmapi"]
    with pytest.raises(ValueError, match="max_concurrency"):
        llmapi.NGramDecodingConfig(max_draft_len=2, max_concurrency=0)
    with pytest.raises(ValueError, match="acceptance_rate_threshold"):
        llmapi.DraftTargetDecodingConfig(
            max_draft_len=2, speculative_model="x", acceptance_rate_threshold=1.5
        )
    with pytest.raises(ValueError, match="Extra inputs"):
        llmapi.DraftTargetDecodingConfig(max_draft_len=2, speculative_model="x", num_speculative_tokens=2)


def test_runtime_settings_reach_the_llm(tiny_models: TinyModels, trtllm_double: DoubleState) -> None:
    config = _config(tiny_models, method="none")
    config["runtime"] = {"maxBatchSize": 8, "maxSeqLen": 128, "kvCacheFreeGpuMemFraction": 0.7}
    engine = build_engine(ServerConfig.model_validate(config))
    (llm,) = trtllm_double.llms
    assert llm.kwargs["speculative_config"] is None
    assert llm.kwargs["max_batch_size"] == 8
    assert llm.kwargs["max_seq_len"] == 128
    assert llm.kwargs["kv_cache_config"].free_gpu_memory_fraction == 0.7
    assert llm.kwargs["kv_cache_config"].enable_block_reuse is True
    assert llm.kwargs["guided_decoding_backend"] == "llguidance"
    assert engine.info.max_model_len == 128


def test_an_eagle3_checkpoint_selects_the_llm_api_automatically(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    config = _config(tiny_models, method="eagle3")
    config["backend"] = "auto"
    config["model"]["speculativeModel"] = str(tiny_models.draft_same)
    assert isinstance(build_engine(ServerConfig.model_validate(config)), LlmApiEngine)


def test_greedy_output_is_the_targets_and_streams_through_the_api(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    tok: Any = AutoTokenizer.from_pretrained(str(tiny_models.target), local_files_only=True)
    model: Any = AutoModelForCausalLM.from_pretrained(str(tiny_models.target), local_files_only=True)
    prompt = "speculative decoding draft target model"
    ids = tok(prompt, return_tensors="pt").input_ids
    with torch.inference_mode():
        expected = model.generate(ids, max_new_tokens=8, do_sample=False)[0, ids.shape[1] :].tolist()
    config = _config(tiny_models, method="promptLookup", draftLen=4)
    app = create_app(build_engine(ServerConfig.model_validate(config)), served_model_name="tiny")
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0}
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=30) as http:
        done = http.post("/v1/completions", json=body)
        with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as stream:
            events = [line for line in stream.iter_lines() if line.startswith("data: ")]
        metrics = http.get("/metrics").text
    assert done.status_code == 200
    assert done.json()["usage"]["completion_tokens"] == len(expected)
    assert done.json()["choices"][0]["text"] == tok.decode(expected, skip_special_tokens=True)
    assert events[-1] == "data: [DONE]"
    assert 'specdeploy_generation_tokens_total{model="tiny"}' in metrics


def test_a_disconnect_aborts_the_llm_request(tiny_models: TinyModels, trtllm_double: DoubleState) -> None:
    trtllm_double.request_delay = 0.05
    engine = build_engine(ServerConfig.model_validate(_config(tiny_models, method="none")))

    async def main() -> None:
        await engine.start()
        gen = engine.generate([5, 6, 7], 100, SamplingParams(temperature=0.0))
        await anext(gen.outputs)
        step = asyncio.ensure_future(anext(gen.outputs))
        await asyncio.sleep(0.01)
        step.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await step
        assert engine.queue_depth == 0
        await engine.stop(1)

    asyncio.run(main())
    (llm,) = trtllm_double.llms
    assert llm.requests[0].aborted()
    assert llm.shut


def test_a_failing_request_is_an_openai_error(tiny_models: TinyModels, trtllm_double: DoubleState) -> None:
    trtllm_double.fail_when = lambda request: "RequestError: prompt too long for the KV cache"
    app = create_app(
        build_engine(ServerConfig.model_validate(_config(tiny_models))), served_model_name="tiny"
    )
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=30) as http:
        bad = http.post("/v1/completions", json={"model": "tiny", "prompt": "hello", "max_tokens": 4})
    assert bad.status_code == 500
    assert bad.json()["error"]["code"] == "executor_error"
    assert "trtllm-llmapi executor: RequestError" in bad.json()["error"]["message"]


def test_logits_acceptance_is_refused(tiny_models: TinyModels, trtllm_double: DoubleState) -> None:
    config = _config(tiny_models, method="draftTarget", acceptance="logits")
    config["model"]["draft"] = str(tiny_models.draft_same)
    with pytest.raises(RuntimeError, match="acceptance logits is not available"):
        build_engine(ServerConfig.model_validate(config))


def test_load_figures_and_stop_aborting_what_is_left(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    """The LLM API engine's queueSeconds is pending tokens over its measured rate; at the shutdown timeout its
    stop aborts the LLM requests still running (their streams end with abort) before shutting the LLM down."""
    trtllm_double.request_delay = 0.01
    engine = build_engine(ServerConfig.model_validate(_config(tiny_models, method="none")))

    async def main() -> None:
        await engine.start()
        assert (engine.queue_depth, engine.queue_seconds, engine.generation_rate) == (0, 0.0, 0.0)
        gen = engine.generate([5, 6, 7], 200, SamplingParams(temperature=0.0))
        first = await anext(gen.outputs)
        assert len(first.token_ids) == 1
        rate = engine.generation_rate
        assert rate > 0
        assert engine.queue_depth == 1
        assert engine.queue_seconds == pytest.approx(199 / rate, rel=1e-12)
        stopping = asyncio.ensure_future(engine.stop(0.1))
        rest = [out async for out in gen.outputs]
        await stopping
        assert rest[-1].finish_reason == FinishReason.ABORT
        assert (engine.queue_depth, engine.queue_seconds) == (0, 0.0)

    asyncio.run(main())
    (llm,) = trtllm_double.llms
    assert llm.requests[0].aborted()
    assert llm.requests[0].outputs[0].finish_reason == "cancelled"
    assert llm.shut


def test_generation_stops_at_every_end_id_of_the_generation_config(
    tmp_path: Path, tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    """Like Llama-3 Instruct's <|eot_id|>: an end-of-sequence id that only generation_config.json names
    stops generation (an explicit end_id would make TensorRT-LLM skip the setup that adds it)."""
    prompt = [5, 6, 7]
    model: Any = AutoModelForCausalLM.from_pretrained(str(tiny_models.target), local_files_only=True)
    with torch.inference_mode():
        expected = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, 3:].tolist()
    stop_at = next(i for i in range(2, 8) if expected[i] not in expected[:i])
    checkpoint = tmp_path / "instruct"
    shutil.copytree(tiny_models.target, checkpoint)
    generation = checkpoint / "generation_config.json"
    settings = json.loads(generation.read_text()) if generation.is_file() else {}
    eos = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True).eos_token_id
    generation.write_text(json.dumps({**settings, "eos_token_id": [eos, expected[stop_at]]}))
    config = _config(tiny_models, method="none")
    config["model"]["target"] = str(checkpoint)
    engine = build_engine(ServerConfig.model_validate(config))

    async def main() -> tuple[list[int], FinishReason | None]:
        await engine.start()
        outputs = [out async for out in engine.generate(prompt, 8, SamplingParams(temperature=0.0)).outputs]
        await engine.stop(1)
        return [t for out in outputs for t in out.token_ids], outputs[-1].finish_reason

    assert asyncio.run(main()) == (expected[: stop_at + 1], FinishReason.STOP)


def _speculating(tiny_models: TinyModels, trtllm_double: DoubleState) -> tuple[LlmApiEngine, list[int]]:
    config = _config(tiny_models, method="draftTarget", draftLen=3)
    config["model"]["draft"] = str(tiny_models.draft_same)
    engine = build_engine(ServerConfig.model_validate(config))
    assert isinstance(engine, LlmApiEngine)

    async def main() -> list[int]:
        await engine.start()
        gen = engine.generate([5, 6, 7], 20, SamplingParams(temperature=0.0))
        sizes = [len(out.token_ids) async for out in gen.outputs]
        await engine.stop(1)
        return sizes

    return engine, asyncio.run(main())


def test_acceptance_comes_from_the_stream_when_perf_metrics_are_zeroed(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    """TensorRT-LLM 1.2.x returns request_perf_metrics.speculative_decoding zeroed (PyTorch flow, default
    sampler): the tokens each streamed response adds beyond 1 are the accepted draft tokens."""
    engine, sizes = _speculating(tiny_models, trtllm_double)
    (llm,) = trtllm_double.llms
    (request,) = llm.requests
    assert request.params.return_perf_metrics is True
    assert request.params.end_id == llm.eos_token_id  # filled in by TensorRT-LLM's own setup, not by us
    assert max(sizes) == 4  # a step that accepted 3 draft tokens streams 4 tokens at once
    assert engine.stats.accepted == request.accepted > 0
    assert engine.stats.drafted == 3 * (len(sizes) - 1)  # k per generation step
    assert engine.acceptance_sources.counts == {"drafter": 0, "perf_metrics": 0, "token_counts": 1}


def test_real_perf_metrics_are_used_where_tensorrt_llm_reports_them(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    trtllm_double.perf_metrics_count_speculation = True
    engine, _ = _speculating(tiny_models, trtllm_double)
    (request,) = trtllm_double.llms[0].requests
    metrics = request.outputs[0].request_perf_metrics
    assert metrics is not None
    assert (engine.stats.drafted, engine.stats.accepted) == (
        metrics.speculative_decoding.total_draft_tokens,
        metrics.speculative_decoding.total_accepted_draft_tokens,
    )
    assert engine.stats.accepted > 0
    assert engine.acceptance_sources.counts == {"drafter": 0, "perf_metrics": 1, "token_counts": 0}


def test_metrics_say_where_acceptance_figures_come_from(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    config = _config(tiny_models, method="promptLookup", draftLen=4)
    app = create_app(build_engine(ServerConfig.model_validate(config)), served_model_name="tiny")
    body = {"model": "tiny", "prompt": "a b c a b c a b c a b", "max_tokens": 12, "temperature": 0}
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=30) as http:
        done = http.post("/v1/completions", json=body)
        metrics = http.get("/metrics").text
    assert done.status_code == 200
    assert 'specdeploy_llmapi_acceptance_source_total{model="tiny",source="token_counts"} 1.0' in metrics
    assert 'specdeploy_llmapi_acceptance_source_total{model="tiny",source="perf_metrics"} 0.0' in metrics
    (request,) = trtllm_double.llms[0].requests
    accepted = next(m for m in metrics.splitlines() if m.startswith("specdeploy_accepted_draft_tokens_total"))
    assert float(accepted.rsplit(" ", 1)[1]) == request.accepted


def test_a_request_the_llm_refuses_up_front_is_an_openai_error_and_frees_its_place(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    config = _config(tiny_models, method="none")
    config["runtime"] = {"maxNumTokens": 8, "enableChunkedContext": False}
    engine = build_engine(ServerConfig.model_validate(config))
    app = create_app(engine, served_model_name="tiny")
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=30) as http:
        bad = http.post(
            "/v1/completions", json={"model": "tiny", "prompt": [5] * 20, "max_tokens": 4, "temperature": 0}
        )
    assert bad.status_code == 500
    assert "trtllm-llmapi executor: The prompt length (20)" in bad.json()["error"]["message"]
    assert engine.queue_depth == 0
    assert trtllm_double.llms[0].requests == []


@pytest.mark.parametrize(("max_queue_size", "admitted"), [(0, 6), (None, 6), (2, 3)])
def test_maxqueuesize_0_is_no_limit_and_a_positive_one_bounds_the_llm_requests(
    tiny_models: TinyModels, trtllm_double: DoubleState, max_queue_size: int | None, admitted: int
) -> None:
    """As in TensorRT-LLM's executor: 0 or null admits every request (they wait in the LLM), N > 0 admits
    maxBatchSize + N and refuses the next with QueueFullError (503)."""
    config = _config(tiny_models, method="none")
    config["runtime"] = {"maxBatchSize": 1, "maxQueueSize": max_queue_size}
    engine = build_engine(ServerConfig.model_validate(config))

    async def main() -> None:
        await engine.start()
        generations = []
        for _ in range(6):
            full = engine.queue_full()  # what the admission gate asks: True exactly when generate refuses
            try:
                generations.append(engine.generate([5, 6, 7], 3, SamplingParams(temperature=0.0)))
            except QueueFullError:
                assert full
                break
            assert not full
        assert len(generations) == admitted
        for gen in generations:
            async for _ in gen.outputs:
                pass
        await engine.stop(1)

    asyncio.run(main())


@pytest.mark.parametrize(
    ("field", "value"),
    [("logit_bias", {"5": 1.0}), ("logprobs", 1)],
)
def test_fields_the_llm_api_backend_does_not_apply_are_refused_naming_it(
    tiny_models: TinyModels, trtllm_double: DoubleState, field: str, value: object
) -> None:
    config = _config(tiny_models, method="promptLookup", draftLen=4)
    app = create_app(build_engine(ServerConfig.model_validate(config)), served_model_name="tiny")
    body = {"model": "tiny", "prompt": "draft target", "max_tokens": 4, field: value}
    with run_live(app) as live, httpx.Client(base_url=live.base_url, timeout=30) as http:
        refused = http.post("/v1/completions", json=body)
        two = http.post("/v1/completions", json={"model": "tiny", "prompt": "x y", "max_tokens": 3, "n": 2})
    assert refused.status_code == 400
    error = refused.json()["error"]
    assert error["param"] == field
    assert "backend (trtllm-llmapi)" in error["message"]
    assert two.status_code == 200
    assert [c["index"] for c in two.json()["choices"]] == [0, 1]
