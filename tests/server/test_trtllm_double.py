"""The TensorRT-LLM test double rejects what the real classes reject (tests/server/trtllm_double.py lists what
it still does differently): a backend that passes against the double does not trip over the real API's
argument checks."""

from __future__ import annotations

import asyncio
import datetime
import sys
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

from tests.server.conftest import TinyModels
from tests.server.trtllm_double import DoubleState, trtllm_double, write_engine
from tests.server.trtllm_double_executor import padded_vocab

__all__ = ["trtllm_double"]


def _bindings() -> Any:
    return sys.modules["tensorrt_llm.bindings.executor"]


def _llmapi() -> Any:
    return sys.modules["tensorrt_llm.llmapi"]


def test_binding_constructors_reject_unknown_and_missing_keywords(trtllm_double: DoubleState) -> None:
    b = _bindings()
    with pytest.raises(TypeError):
        b.KvCacheConfig(enable_block_reuse=True, free_gpu_mem_fraction=0.5)  # misspelt
    with pytest.raises(TypeError):
        b.DynamicBatchConfig(enable_batch_size_tuning=True, enable_max_num_tokens_tuning=False)  # no window
    config = b.DynamicBatchConfig(
        enable_batch_size_tuning=True,
        enable_max_num_tokens_tuning=False,
        dynamic_batch_moving_average_window=8,
    )
    assert config.dynamic_batch_moving_average_window == 8
    with pytest.raises(TypeError):
        b.Request(input_token_ids=[1, 2], max_tokens=3, max_new_tokens=3)
    with pytest.raises(TypeError):
        b.SamplingConfig(1, beam_width_array=[1])


def test_model_types_are_the_real_members(trtllm_double: DoubleState) -> None:
    assert [m.name for m in _bindings().ModelType] == ["DECODER_ONLY", "ENCODER_ONLY", "ENCODER_DECODER"]


def test_external_draft_tokens_need_tokens_and_two_dimensional_logits_with_one_row_each(
    trtllm_double: DoubleState,
) -> None:
    b = _bindings()
    with pytest.raises(RuntimeError, match="empty"):
        b.ExternalDraftTokensConfig([])
    with pytest.raises(RuntimeError, match="numDraftTokens"):
        b.ExternalDraftTokensConfig([1, 2], torch.zeros(10))
    with pytest.raises(RuntimeError, match="numDraftTokens"):
        b.ExternalDraftTokensConfig([1, 2], torch.zeros(3, 10))
    assert b.ExternalDraftTokensConfig([1, 2], torch.zeros(2, 10)).logits.shape == (2, 10)


def test_the_vocabulary_is_padded_to_a_multiple_of_the_world_size() -> None:
    assert padded_vocab(384, 1) == 384
    assert padded_vocab(384, 5) == 385
    assert padded_vocab(32001, 2) == 32002


def test_llm_api_models_validate_like_pydantic(trtllm_double: DoubleState) -> None:
    api = _llmapi()
    with pytest.raises(ValueError, match="Extra inputs"):
        api.NGramDecodingConfig(max_draft_len=4, prompt_lookup_num_tokens=4)
    for bad in ({"max_draft_len": 0}, {}):
        with pytest.raises(ValueError, match="max_draft_len"):
            api.NGramDecodingConfig(**bad)
    with pytest.raises(ValueError, match="speculative model"):
        api.DraftTargetDecodingConfig(max_draft_len=4)
    with pytest.raises(ValueError, match="max_draft_len"):
        api.Eagle3DecodingConfig(max_draft_len=0, speculative_model_dir="/m")
    assert api.EagleDecodingConfig(max_draft_len=3, speculative_model_dir="/m").speculative_model == "/m"
    with pytest.raises(TypeError):  # a kw-only dataclass
        api.SamplingParams(max_tokens=4, stop_ids=[2])
    with pytest.raises(TypeError):
        api.SamplingParams(4)


def test_llm_rejects_unknown_keywords_and_refuses_prompts_up_front(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    llm_class = sys.modules["tensorrt_llm"].LLM
    with pytest.raises(ValueError, match="max_tokens_in_paged_kv_cache"):
        llm_class(str(tiny_models.target), max_tokens_in_paged_kv_cache=10)
    llm = llm_class(str(tiny_models.target), max_num_tokens=4, enable_chunked_prefill=False)
    params = _llmapi().SamplingParams(max_tokens=2)
    with pytest.raises(ValueError, match="max_num_tokens"):
        llm.generate_async([5, 6, 7, 8, 9], params, streaming=True)
    with pytest.raises(ValueError, match="empty"):
        llm.generate_async([], params)


def test_an_aborted_stream_ends_with_a_cancelled_final_output(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    llm = sys.modules["tensorrt_llm"].LLM(str(tiny_models.target))
    output = llm.generate_async([5, 6, 7], _llmapi().SamplingParams(max_tokens=50, top_k=1), streaming=True)

    async def main() -> list[tuple[int, str | None, bool]]:
        seen = []
        async for out in output:
            seen.append((len(out.outputs[0].token_ids_diff), out.outputs[0].finish_reason, out.finished))
            if len(seen) == 2:
                out.abort()
        return seen

    seen = asyncio.run(main())
    assert seen[:2] == [(1, None, False), (1, None, False)]
    assert seen[2:] == [(0, "cancelled", True)]


def test_a_speculating_stream_yields_several_tokens_per_response(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    api = _llmapi()
    spec = api.DraftTargetDecodingConfig(max_draft_len=3, speculative_model_dir=str(tiny_models.draft_same))
    llm = sys.modules["tensorrt_llm"].LLM(str(tiny_models.target), speculative_config=spec)
    output = llm.generate_async([5, 6, 7], api.SamplingParams(max_tokens=20, top_k=1), streaming=True)

    async def main() -> list[int]:
        return [len(out.outputs[0].token_ids_diff) async for out in output]

    sizes = asyncio.run(main())
    assert sizes[0] == 1  # the context step
    assert max(sizes) == 4  # a generation step: 3 accepted draft tokens + 1
    assert sum(sizes) == 20


def test_cancel_request_ignores_terminated_requests_and_fails_after_shutdown(
    tmp_path: Any, tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    b = _bindings()
    engine = write_engine(tmp_path / "engine", tiny_models.target, trtllm_double)
    config = b.ExecutorConfig(parallel_config=b.ParallelConfig(device_ids=[0]))
    executor = b.Executor(engine, b.ModelType.DECODER_ONLY, config)
    (request_id,) = executor.enqueue_requests([b.Request([5, 6, 7], 2, end_id=0)])
    responses: list[Any] = []
    while not responses:
        responses = executor.await_responses(timeout=datetime.timedelta(seconds=1))
    assert responses[0].result.is_final
    executor.cancel_request(request_id)
    assert trtllm_double.ignored_cancels == [request_id]
    assert trtllm_double.cancelled == []
    executor.shutdown()
    with pytest.raises(RuntimeError, match="Shutdown"):
        executor.cancel_request(request_id)
    with pytest.raises(RuntimeError, match="Shutdown"):
        executor.enqueue_requests([b.Request([5], 1)])


def test_guided_decoding_and_sampling_values_are_validated_as_tensorrt_llm_validates_them(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    llmapi = _llmapi()
    with pytest.raises(ValueError, match="Only one guide"):
        llmapi.SamplingParams(guided_decoding=llmapi.GuidedDecodingParams(json_object=True, regex="a+"))
    with pytest.raises(ValueError, match="Unsupported guided decoding backend"):
        llmapi.LLM(str(tiny_models.target), guided_decoding_backend="outlines")
    plain = llmapi.LLM(str(tiny_models.target))
    guided = llmapi.SamplingParams(guided_decoding=llmapi.GuidedDecodingParams(regex="[ab]+"))
    with pytest.raises(ValueError, match="guided_decoding_backend"):
        plain.generate_async([5, 6, 7], guided)
    llm = llmapi.LLM(str(tiny_models.target), guided_decoding_backend="llguidance")
    tag = llmapi.SamplingParams(guided_decoding=llmapi.GuidedDecodingParams(structural_tag="{}"))
    with pytest.raises(ValueError, match="Unsupported guide type"):  # llguidance takes no structural tags
        llm.generate_async([5, 6, 7], tag)
    for bad in ({"repetition_penalty": 0.0}, {"top_k": -1}, {"min_p": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            llm.generate_async([5, 6, 7], llmapi.SamplingParams(**bad))


def test_the_doubles_guided_decoding_constrains_its_model_output(
    tiny_models: TinyModels, trtllm_double: DoubleState
) -> None:
    llmapi = _llmapi()
    llm = llmapi.LLM(str(tiny_models.target), guided_decoding_backend="llguidance")
    guide = llmapi.GuidedDecodingParams(regex="(ab)+c")
    output = llm.generate_async(
        [5, 6, 7], llmapi.SamplingParams(max_tokens=30, temperature=1.0, seed=3, guided_decoding=guide)
    )

    async def main() -> list[int]:
        async for out in output:
            if out.finished:
                return list(out.outputs[0].token_ids)
        return []

    tokens = asyncio.run(main())
    assert output.outputs[0].finish_reason == "stop"
    assert tokens[-1] == llm.eos_token_id
    tokenizer: Any = AutoTokenizer.from_pretrained(str(tiny_models.target), local_files_only=True)
    text = tokenizer.decode(tokens[:-1])
    assert len(text) >= 3
    assert text.endswith("c")
    assert text[:-1] == "ab" * (len(text) // 2)
