"""Backend trtllm-llmapi through the TensorRT-LLM test double: the speculative_config rendered per method, the
LLM's settings, greedy output through the serving layer, disconnects and errors."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import httpx
import pytest
import torch
from specdeploy_server.api.app import create_app
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.backends.trtllm_llmapi import LlmApiEngine
from specdeploy_server.config import ServerConfig
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
    ],
    ids=["eagle3", "ngram", "draft-target", "mtp"],
)
def test_the_speculative_config_is_rendered_from_the_method(
    *,
    tiny_models: TinyModels,
    trtllm_double: DoubleState,
    speculative: dict[str, Any],
    extra_model: str | None,
    kind: str,
    fields: dict[str, Any],
) -> None:
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
