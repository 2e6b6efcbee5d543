"""A test double of the small part of TensorRT-LLM the server calls, driven by the tiny reference models.

TensorRT-LLM cannot be installed here (PyPI only holds a placeholder that fetches the wheel from NVIDIA's own
index), so the ``trtllm_double`` fixture puts stand-in ``tensorrt_llm``, ``tensorrt_llm.bindings.executor``
and ``tensorrt_llm.llmapi`` modules into ``sys.modules``. Class, argument, field and enum names are those of
the real package, checked against its sources (docs/trtllm.md, "Fidelity"). What the double computes is
real: an ``Executor`` loads the Hugging Face checkpoint registered for its engine directory and runs it with
transformers, and ``LLM`` runs its checkpoint (and, when speculating, a drafter) the same way: outputs are the
tiny models' own.

The double is in parts, by binding: ``trtllm_double_executor`` (the executor bindings),
``trtllm_double_llmapi`` (the LLM API; its config models in ``trtllm_double_configs``, its drafting
from the request's tokens in ``trtllm_double_matching``),
``trtllm_double_drafter`` (a drafter in the PyTorch executor), ``trtllm_double_sampling`` (the LLM API's
sampling and guided decoding); they share one ``DoubleState`` (``trtllm_double_state``), which the fixture
below installs fresh for each test. This module installs the parts as ``tensorrt_llm`` and writes engine
directories.

The double rejects what the real classes reject:

* bindings (nanobind): an unknown or missing keyword raises ``TypeError``; ``DynamicBatchConfig`` has three
  required arguments; ``ModelType`` has ``DECODER_ONLY``, ``ENCODER_ONLY``, ``ENCODER_DECODER``;
  ``ExternalDraftTokensConfig`` refuses an empty token list and logits that are not 2-D with one row per draft
  token (``TLLM_CHECK``: ``RuntimeError``); the executor answers a request over ``max_input_len``,
  ``max_seq_len``, ``max_draft_len``, with a token id or draft-logits width outside its padded vocabulary, or
  asking for generation logits it does not gather, with an error ``Response``; ``cancel_request`` on a request
  already answered as final is ignored (the real one logs "Ignoring already terminated request") and after
  ``shutdown()`` raises ``RuntimeError``;
* LLM API (pydantic models and a kw-only dataclass): an unknown keyword of ``LLM`` or of a config model raises
  ``ValueError`` (pydantic's ``ValidationError`` is one), of ``SamplingParams`` ``TypeError``;
  ``max_draft_len`` must be > 0 for NGram, DraftTarget and EAGLE; DraftTarget and EAGLE need a speculative
  model; ``generate_async`` can raise ``ValueError`` before anything runs; a stream yields one output per
  executor response with cumulative ``token_ids``, several new tokens when a step accepted drafts;
  ``abort()`` ends the stream with a final output whose ``finish_reason`` is ``'cancelled'``; ``end_id`` left
  unset is filled in from the tokenizer and the checkpoint's ``generation_config.json`` adds its other
  end-of-sequence ids as stop tokens, while an explicit ``end_id`` skips that setup; ``SamplingParams``'
  penalties, ``top_k``, ``min_p`` and ``guided_decoding`` are applied and validated as in
  ``tests/server/trtllm_double_sampling.py`` (guided decoding with llguidance, as TensorRT-LLM's llguidance
  backend: the mask really constrains the model's output).

Differences from the real API that remain, and why:

1. One worker thread per executor runs requests one after another, re-running the whole prefix per token (no
   in-flight batching, no KV cache): the tests need outputs, not speed.
2. Constructors know only the keywords our code uses plus a few neighbours; a keyword the real class has but
   the double lacks fails here. Stricter, never looser.
3. ``Executor(...)`` with a model type other than ``DECODER_ONLY`` raises ``RuntimeError`` at once; the real
   one fails while loading the engine. Only decoder-only checkpoints exist here.
4. A target request with external draft tokens returns the accepted draft tokens plus one token of its own
   and finishes, as TensorRT-LLM's own draft-target loop assumes; whether the real executor instead keeps
   decoding up to ``max_tokens`` is not settled by the source, so the state's ``continue_after_verify = True``
   makes the double do that (the server must count acceptance right either way).
5. Padded vocabulary columns of generation logits are 0 (a zero-padded ``lm_head``); sampling ignores them,
   as the real sampler does beyond ``vocab_size``. ``acceptance_threshold`` and ``fast_logits`` are accepted
   and ignored; sampled draft tokens are verified by rejection sampling, greedy ones by token match.
6. Iteration statistics: one entry per request, not per iteration; the executor reports no perf metrics.
7. The LLM runs in-process (no MPI workers, no tokenizer on the prompt: prompts are token ids). EAGLE/EAGLE-3,
   PARD and DFlash ``speculative_model`` checkpoints are run as plain autoregressive draft models (the tiny
   models have no EAGLE heads, mask-token training or block diffusion; ``mask_token_id`` and
   ``target_layer_ids`` are validated, not used), MTP has no heads at all and decodes one token per step, the
   suffix automaton (``SADecodingConfig``, ``sa_config``) is a search for the longest earlier match in the
   request's own tokens (``enable_global_pool`` is accepted and ignored), and sampled requests verify drafts
   by token match against the target's own samples rather than by rejection sampling.
8. ``request_perf_metrics.speculative_decoding`` comes back zeroed, as in 1.2.x's PyTorch flow with the
   default sampler; the state's ``perf_metrics_count_speculation = True`` reports the real counts (upstream PR
   #17082).
10. User-provided drafters (``UserProvidedDecodingConfig``, ``Drafter``): as in
   ``tests/server/trtllm_double_drafter.py``, whose differences hold here too; the LLM steps each request
   alone (item 7), so the drafter sees batches of one request here (the drafter double's ``PyExecutor`` runs
   real batches).
9. ``generate_async`` checks only an empty prompt, a prompt longer than ``max_num_tokens`` without chunked
   prefill, and a prompt longer than ``max_seq_len``; the state's ``fail_when`` makes it raise
   ``RuntimeError`` (TensorRT-LLM's ``RequestError``) for chosen prompts. Error messages are the double's own.
11. ``LLM.get_stats(timeout)`` returns the iteration statistics as dicts (older releases: JSON strings), only
   with ``enable_iter_perf_stats``, with the fields our code reads and a few neighbours (no KV-cache or memory
   figures). An iteration runs one request (item 7), so ``numGenRequests`` is 0 or 1; its
   ``iterLatencyMS`` is the double's own CPU time, and ``specDecodingStats.iterLatencyMS`` (the drafter's
   time, newer releases) is reported for a draft model only, as there.
"""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.server import trtllm_double_configs as configs_double
from tests.server import trtllm_double_drafter as drafter_double
from tests.server import trtllm_double_executor as executor_double
from tests.server import trtllm_double_llmapi as llmapi_double
from tests.server.trtllm_double_sampling import GuidedDecodingParams
from tests.server.trtllm_double_state import DoubleState, install_state

__all__ = ["DoubleState", "engines_config", "trtllm_double", "write_engine"]


# ------------------------------------------------------------------------------------------ installing
def _module(name: str, file: str | None = None, **members: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    # as an imported module has: importlib.util.find_spec (the server's backend detection) reads it
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, origin=file)
    for key, value in members.items():
        setattr(module, key, value)
    if file is not None:
        module.__file__ = file
    return module


@pytest.fixture
def trtllm_double(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[DoubleState]:
    """Install the double as ``tensorrt_llm`` for one test; yields its state."""
    state = install_state(DoubleState())
    executor = _module(
        "tensorrt_llm.bindings.executor",
        Executor=executor_double.Executor,
        ModelType=executor_double.ModelType,
        ExecutorConfig=executor_double.ExecutorConfig,
        KvCacheConfig=executor_double.KvCacheConfig,
        SchedulerConfig=executor_double.SchedulerConfig,
        DynamicBatchConfig=executor_double.DynamicBatchConfig,
        CapacitySchedulerPolicy=executor_double.CapacitySchedulerPolicy,
        ParallelConfig=executor_double.ParallelConfig,
        OrchestratorConfig=executor_double.OrchestratorConfig,
        CommunicationType=executor_double.CommunicationType,
        CommunicationMode=executor_double.CommunicationMode,
        Request=executor_double.Request,
        SamplingConfig=executor_double.SamplingConfig,
        OutputConfig=executor_double.OutputConfig,
        ExternalDraftTokensConfig=executor_double.ExternalDraftTokensConfig,
        FinishReason=executor_double.FinishReason,
    )
    llmapi = _module(
        "tensorrt_llm.llmapi",
        LLM=llmapi_double.LLM,
        KvCacheConfig=configs_double.LlmKvCacheConfig,
        SchedulerConfig=configs_double.LlmSchedulerConfig,
        CapacitySchedulerPolicy=executor_double.CapacitySchedulerPolicy,
        EagleDecodingConfig=configs_double.EagleDecodingConfig,
        Eagle3DecodingConfig=configs_double.Eagle3DecodingConfig,
        NGramDecodingConfig=configs_double.NGramDecodingConfig,
        DraftTargetDecodingConfig=configs_double.DraftTargetDecodingConfig,
        MTPDecodingConfig=configs_double.MTPDecodingConfig,
        AutoDecodingConfig=configs_double.AutoDecodingConfig,
        SADecodingConfig=configs_double.SADecodingConfig,
        SAEnhancerConfig=configs_double.SAEnhancerConfig,
        PARDDecodingConfig=configs_double.PARDDecodingConfig,
        DFlashDecodingConfig=configs_double.DFlashDecodingConfig,
        UserProvidedDecodingConfig=drafter_double.UserProvidedDecodingConfig,
        SamplingParams=llmapi_double.SamplingParams,
        GuidedDecodingParams=GuidedDecodingParams,
    )
    bindings = _module("tensorrt_llm.bindings", executor=executor)
    drafter = _module("tensorrt_llm._torch.speculative.drafter", Drafter=drafter_double.Drafter)
    root = _module(
        "tensorrt_llm",
        str(tmp_path / "tensorrt_llm" / "__init__.py"),
        LLM=llmapi_double.LLM,
        SamplingParams=llmapi_double.SamplingParams,
        bindings=bindings,
        llmapi=llmapi,
        __version__="1.2.1",
    )
    for name, module in (
        ("tensorrt_llm", root),
        ("tensorrt_llm.bindings", bindings),
        ("tensorrt_llm.bindings.executor", executor),
        ("tensorrt_llm.llmapi", llmapi),
        ("tensorrt_llm._torch.speculative.drafter", drafter),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    yield state
    for ex in state.executors:
        if not ex._shut:
            ex.shutdown()


# ------------------------------------------------------------------------------------------ engine dirs
def write_engine(
    directory: Path,
    checkpoint: Path,
    state: DoubleState,
    *,
    tp_size: int = 1,
    pp_size: int = 1,
    speculative_decoding_mode: int = 2,
    max_draft_len: int = 10,
    gather_generation_logits: bool = False,
    use_paged_context_fmha: bool = True,
    max_input_len: int = 200,
    max_seq_len: int = 256,
    max_batch_size: int = 16,
    vocab_size: int | None = None,
) -> Path:
    """An engine directory in trtllm-build's layout (config.json, rank*.engine, tokenizer/) standing for
    ``checkpoint``; ``state`` (the double) runs the checkpoint when an Executor opens the directory."""
    hf = json.loads((checkpoint / "config.json").read_text())
    directory.mkdir(parents=True)
    config = {
        "version": "0.21.0",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "float32",
            "vocab_size": vocab_size if vocab_size is not None else hf["vocab_size"],
            "hidden_size": hf["hidden_size"],
            "num_hidden_layers": hf["num_hidden_layers"],
            "num_attention_heads": hf["num_attention_heads"],
            "num_key_value_heads": hf["num_key_value_heads"],
            "max_position_embeddings": hf["max_position_embeddings"],
            "mapping": {
                "world_size": tp_size * pp_size,
                "tp_size": tp_size,
                "pp_size": pp_size,
                "gpus_per_node": 8,
            },
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        },
        "build_config": {
            "max_input_len": max_input_len,
            "max_seq_len": max_seq_len,
            "max_batch_size": max_batch_size,
            "max_beam_width": 1,
            "max_num_tokens": 8192,
            "max_draft_len": max_draft_len,
            "speculative_decoding_mode": speculative_decoding_mode,
            "gather_context_logits": False,
            "gather_generation_logits": gather_generation_logits,
            "kv_cache_type": "PAGED",
            "plugin_config": {
                "gpt_attention_plugin": "auto",
                "gemm_plugin": None,
                "use_paged_context_fmha": use_paged_context_fmha,
                "paged_kv_cache": True,
                "tokens_per_block": 32,
                "remove_input_padding": True,
                "context_fmha": True,
            },
        },
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    for rank in range(tp_size * pp_size):
        (directory / f"rank{rank}.engine").write_bytes(b"serialized engine stands here")
    tokenizer = directory / "tokenizer"
    tokenizer.mkdir()
    for item in checkpoint.iterdir():
        if item.is_file() and ("token" in item.name or item.name == "generation_config.json"):
            (tokenizer / item.name).write_bytes(item.read_bytes())
    state.checkpoints[directory] = checkpoint
    return directory


def engines_config(
    directory: Path, target: Path, state: DoubleState, draft: Path | None, **target_engine: Any
) -> dict[str, Any]:
    """A server config of backend trtllm-engine over engine directories under ``directory`` standing for the
    checkpoints ``target`` (built with ``target_engine``, see write_engine) and ``draft`` where given."""
    model: dict[str, Any] = {
        "target": str(write_engine(directory / "target", target, state, **target_engine))
    }
    if draft is not None:
        model["draft"] = str(write_engine(directory / "draft", draft, state, speculative_decoding_mode=1))
    return {"model": model, "backend": "trtllm-engine"}
