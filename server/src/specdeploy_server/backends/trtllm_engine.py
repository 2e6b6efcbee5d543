"""Backend ``trtllm-engine``: TensorRT-LLM engines run by the executor (``tensorrt_llm.bindings.executor``).

Two executors live in this one process, both in orchestrator mode with their own ``device_ids``: the target
engine, and the draft engine when the method is ``draftTarget``. The speculative core drives them, one batched
call per executor per step, exactly as TensorRT-LLM's own draft-target loop (``examples/run.py``) does
(``trtllm_executors``: the requests of a step). Prompt lookup uses the core's n-gram drafter against the
target alone.

This module builds the engine: the executors' configuration from the server's, the executors, the drafter and
the scheduler. It is thin glue over the bindings; the bindings are imported lazily, after the engines'
config.json passed the checks in ``engine_config``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from specdeploy_server.backends.engine_config import (
    DRAFT_TOKENS_EXTERNAL,
    EngineFacts,
    EngineSetup,
    check_engines,
)
from specdeploy_server.backends.errors import import_tensorrt_llm
from specdeploy_server.backends.trtllm_executor_client import ExecutorClient
from specdeploy_server.backends.trtllm_executors import RequestFactory, TrtDraftExecutor, TrtTargetExecutor
from specdeploy_server.config import Acceptance, Method, RuntimeConfig, ServerConfig
from specdeploy_server.core.drafters import Drafter, DraftModelDrafter, NoDrafter, PromptLookupDrafter
from specdeploy_server.core.scheduler import SchedulerObserver, SchedulerSettings, SpeculativeScheduler
from specdeploy_server.engine import Engine, ExecutorSample, Feature, model_info
from specdeploy_server.tokenizer import HFTokenizer

log = logging.getLogger(__name__)

BACKEND = "trtllm-engine"
#: DynamicBatchConfig's moving-average window when runtime tuning is on (our choice)
DYNAMIC_BATCH_WINDOW = 128


def executor_config(
    bindings: Any,
    runtime: RuntimeConfig,
    *,
    engine: EngineFacts,
    device_ids: Sequence[int],
    kv_fraction: float,
    max_batch_size: int,
    gather_generation_logits: bool,
    worker_path: Path,
) -> Any:
    """ExecutorConfig for one engine: orchestrator mode on ``device_ids``, KV block reuse, runtime knobs."""
    b = bindings
    kv = b.KvCacheConfig(
        enable_block_reuse=runtime.enable_kv_cache_reuse,
        free_gpu_memory_fraction=kv_fraction,
        host_cache_size=(
            runtime.kv_cache_host_memory_megabytes * 1024 * 1024
            if runtime.kv_cache_host_memory_megabytes
            else None
        ),
        onboard_blocks=True if runtime.kv_cache_onboard_blocks is None else runtime.kv_cache_onboard_blocks,
        cross_kv_cache_fraction=runtime.cross_kv_cache_fraction,
        secondary_offload_min_priority=runtime.secondary_offload_min_priority,
        event_buffer_max_size=runtime.event_buffer_max_size or 0,
    )
    dynamic = None
    if runtime.enable_batch_size_tuning or runtime.enable_max_num_tokens_tuning:
        dynamic = b.DynamicBatchConfig(
            enable_batch_size_tuning=bool(runtime.enable_batch_size_tuning),
            enable_max_num_tokens_tuning=bool(runtime.enable_max_num_tokens_tuning),
            dynamic_batch_moving_average_window=DYNAMIC_BATCH_WINDOW,
        )
    policy = (
        b.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
        if runtime.guaranteed_no_evict
        else b.CapacitySchedulerPolicy.MAX_UTILIZATION
    )
    parallel = b.ParallelConfig(
        communication_type=b.CommunicationType.MPI,
        communication_mode=b.CommunicationMode.ORCHESTRATOR,
        device_ids=list(device_ids),
        orchestrator_config=b.OrchestratorConfig(
            is_orchestrator=True, worker_executable_path=str(worker_path)
        ),
    )
    max_num_tokens = runtime.max_num_tokens
    if engine.max_num_tokens is not None:
        max_num_tokens = min(max_num_tokens, engine.max_num_tokens)
    return b.ExecutorConfig(
        max_beam_width=1,
        scheduler_config=b.SchedulerConfig(capacity_scheduler_policy=policy, dynamic_batch_config=dynamic),
        kv_cache_config=kv,
        enable_chunked_context=runtime.enable_chunked_context,
        max_batch_size=max_batch_size,
        max_num_tokens=max_num_tokens,
        parallel_config=parallel,
        gather_generation_logits=gather_generation_logits,
    )


def tokenizer_dir(config: ServerConfig) -> Path:
    """``model.tokenizer``, else ``<target>/tokenizer`` (where the operator's build Job puts it), else the
    target directory."""
    if config.model.tokenizer is not None:
        return config.model.tokenizer
    beside = config.model.target / "tokenizer"
    return beside if beside.is_dir() else config.model.target


def executor_samples(clients: Sequence[ExecutorClient]) -> list[ExecutorSample]:
    """The executors' latest iteration statistics, for /metrics."""
    samples = []
    for client in clients:
        stats = client.latest_stats()
        if stats is None:
            continue
        kv = getattr(stats, "kv_cache_stats", None)
        latency_ms = getattr(stats, "iter_latency_ms", None)
        samples.append(
            ExecutorSample(
                executor=client.name,
                active_requests=int(stats.num_active_requests),
                queued_requests=int(getattr(stats, "num_queued_requests", 0)),
                iteration_seconds=None if latency_ms is None else float(latency_ms) / 1000.0,
                kv_blocks_used=None if kv is None else int(kv.used_num_blocks),
                kv_blocks_free=None if kv is None else int(kv.free_num_blocks),
            )
        )
    return samples


def build_trtllm_engine(config: ServerConfig, observer: SchedulerObserver | None = None) -> Engine:
    setup: EngineSetup = check_engines(config)  # before tensorrt_llm is imported, before any GPU work
    bindings = import_tensorrt_llm("tensorrt_llm.bindings.executor", BACKEND)
    package = import_tensorrt_llm("tensorrt_llm", BACKEND)
    worker_path = Path(str(package.__file__)).parent / "bin" / "executorWorker"
    tokenizer = HFTokenizer(tokenizer_dir(config), config.serving.chat_template)
    end_id = tokenizer.eos_token_id
    if end_id is None:
        raise ValueError(f"the tokenizer at {tokenizer_dir(config)} has no end-of-sequence token")
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end_id
    runtime, placement, spec = config.runtime, config.placement, config.speculative
    logits = config.method == Method.DRAFT_TARGET and spec.acceptance == Acceptance.LOGITS
    requests = RequestFactory(bindings, end_id, pad_id, logits_width=setup.target.vocab_size_padded)
    clients: list[ExecutorClient] = []

    def start(facts: EngineFacts, device_ids: list[int], fraction: float, gather: bool) -> ExecutorClient:
        log.info(
            "%s: starting the executor on GPUs %s (KV cache: %.2f of free memory)",
            facts.describe(),
            device_ids,
            fraction,
        )
        executor = bindings.Executor(
            facts.path,
            bindings.ModelType.DECODER_ONLY,
            executor_config(
                bindings,
                runtime,
                engine=facts,
                device_ids=device_ids,
                kv_fraction=fraction,
                max_batch_size=setup.max_batch_size,
                gather_generation_logits=gather,
                worker_path=worker_path,
            ),
        )
        client = ExecutorClient(facts.role, executor)
        clients.append(client)
        return client

    def close() -> None:
        for client in clients:
            client.close()

    # The target verifies as many external draft tokens as its engine was built for (a request's prediction
    # may use them all); the deployment's drafts stay within speculative.maxDraftLen (the scheduler's cap).
    verify_len = max(prediction_draft_len(setup.target), setup.max_draft_len)
    try:
        # The target first: each executor's KV cache takes its fraction of the memory free when it starts.
        target = TrtTargetExecutor(
            start(setup.target, placement.target_device_ids, runtime.kv_cache_free_gpu_mem_fraction, False),
            requests,
            verify_len,
        )
        drafter: Drafter
        if setup.draft is not None:
            fraction = runtime.draft_kv_cache_free_gpu_mem_fraction or runtime.kv_cache_free_gpu_mem_fraction
            client = start(setup.draft, placement.draft_device_ids, fraction, logits)
            drafter = DraftModelDrafter(TrtDraftExecutor(client, requests))
        elif config.method == Method.PROMPT_LOOKUP:
            drafter = PromptLookupDrafter(spec.prompt_lookup.max_matching_ngram_size)
        else:
            drafter = NoDrafter()
    except Exception:
        close()
        raise
    settings = SchedulerSettings(
        max_batch_size=setup.max_batch_size,
        max_queue_size=runtime.max_queue_size,
        max_model_len=setup.max_model_len,
        acceptance=spec.acceptance.value,
        draft_len=None if spec.draft_len == "auto" else spec.draft_len,
        disable_above_concurrency=spec.disable_above_concurrency,
        max_draft_len=setup.max_draft_len,
    )
    scheduler = SpeculativeScheduler(target, drafter, settings, observer)
    engine = Engine(
        tokenizer,
        scheduler,
        model_info(
            config.model.name,
            setup.max_model_len,
            setup.target.vocab_size,
            # our loop drafts and verifies: a request's draft-length cap is its to honour, and so is its
            # prediction where the target engine takes external draft tokens
            frozenset({Feature.PREDICTION, Feature.SPECULATION_CONTROL})
            if verify_len
            else frozenset({Feature.SPECULATION_CONTROL}),
            backend="trtllm-engine",
        ),
        on_close=close,
    )
    engine.executor_stats = lambda: executor_samples(clients)
    log.info(
        "trtllm-engine: method %s, draftLen %s (engine max %d), acceptance %s, max model len %d",
        config.method.value,
        spec.draft_len,
        setup.max_draft_len,
        spec.acceptance.value,
        setup.max_model_len,
    )
    return engine


def prediction_draft_len(target: EngineFacts) -> int:
    """The most draft tokens a prediction may propose per step: the target engine's build max_draft_len
    when it was built for external draft tokens (``draft_tokens_external``), else 0 (no predictions)."""
    if target.speculative_decoding_mode != DRAFT_TOKENS_EXTERNAL:
        return 0
    return target.max_draft_len
