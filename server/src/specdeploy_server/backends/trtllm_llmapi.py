"""Backend ``trtllm-llmapi``: TensorRT-LLM's LLM API (``tensorrt_llm.LLM``, PyTorch backend).

TensorRT-LLM runs the speculation itself here (``speculative_config``: ``Eagle3``/``Eagle``, ``NGram``,
``DraftTarget``, ``MTP``), so our scheduler is not involved: this engine streams ``generate_async`` outputs
into the same serving layer, with the same admission rules (``maxBatchSize`` running + ``maxQueueSize``
waiting, then 503) and the same load figures for autoscaling. Checkpoints are Hugging Face directories;
nothing is built.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from specdeploy_server.backends.errors import BackendUnavailableError, import_tensorrt_llm
from specdeploy_server.config import Acceptance, Method, ServerConfig
from specdeploy_server.core.executors import ExecutorError
from specdeploy_server.core.load import ThroughputMeter
from specdeploy_server.core.scheduler import (
    EngineStoppedError,
    GlobalStats,
    QueueFullError,
    SchedulerObserver,
)
from specdeploy_server.core.types import FinishReason, SamplingParams, SeqStats, StepOutput
from specdeploy_server.engine import Generation, ModelInfo, model_info
from specdeploy_server.metrics import ExecutorSample
from specdeploy_server.tokenizer import HFTokenizer, Tokenizer

log = logging.getLogger(__name__)

BACKEND = "trtllm-llmapi"
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}
_ABORT_WAIT_SECONDS = 1.0  # how long aborted streams get to end before the LLM shuts down


@runtime_checkable
class RequestObserver(Protocol):
    """Receives per-request speculation totals (the LLM API reports them per request, not per step)."""

    def on_request_speculation(self, drafted: int, accepted: int) -> None: ...


def draft_len(config: ServerConfig) -> int:
    spec = config.speculative
    if spec.draft_len == "auto":
        log.warning("draftLen auto is not available with %s: maxDraftLen %d", BACKEND, spec.max_draft_len)
        return spec.max_draft_len
    return spec.draft_len


def speculative_config(llmapi: Any, config: ServerConfig) -> Any:
    """The ``speculative_config`` for our method (None for plain decoding)."""
    method, k = config.method, draft_len(config)
    if method == Method.NONE or k == 0:
        return None
    if method == Method.DRAFT_TARGET:
        draft = str(config.model.draft)
        return llmapi.DraftTargetDecodingConfig(max_draft_len=k, speculative_model_dir=draft)
    if method == Method.PROMPT_LOOKUP:
        # Per-request pools and the oldest match: the semantics of our own promptLookup.
        return llmapi.NGramDecodingConfig(
            max_draft_len=k,
            max_matching_ngram_size=config.speculative.prompt_lookup.max_matching_ngram_size,
            is_keep_all=True,
            is_use_oldest=True,
            is_public_pool=False,
        )
    if method == Method.EAGLE3:
        # Newer releases name the class Eagle3DecodingConfig; 1.0-1.2 run EAGLE-3 via EagleDecodingConfig.
        eagle = getattr(llmapi, "Eagle3DecodingConfig", None) or llmapi.EagleDecodingConfig
        return eagle(max_draft_len=k, speculative_model_dir=str(config.model.speculative_model))
    if method == Method.MTP:
        return llmapi.MTPDecodingConfig(num_nextn_predict_layers=k)
    raise ValueError(f"speculative.method {method.value} is not supported by {BACKEND}")


def llm_arguments(llmapi: Any, config: ServerConfig, tokenizer: Path) -> dict[str, Any]:
    """Keyword arguments of ``tensorrt_llm.LLM`` (the LLM API's ``TorchLlmArgs`` fields)."""
    runtime = config.runtime
    policy = (
        llmapi.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
        if runtime.guaranteed_no_evict
        else llmapi.CapacitySchedulerPolicy.MAX_UTILIZATION
    )
    spec = speculative_config(llmapi, config)
    args: dict[str, Any] = {
        "model": str(config.model.target),
        "tokenizer": str(tokenizer),
        "tensor_parallel_size": len(config.placement.target_device_ids),
        "max_batch_size": runtime.max_batch_size,
        "max_num_tokens": runtime.max_num_tokens,
        "kv_cache_config": llmapi.KvCacheConfig(
            enable_block_reuse=runtime.enable_kv_cache_reuse,
            free_gpu_memory_fraction=runtime.kv_cache_free_gpu_mem_fraction,
        ),
        "scheduler_config": llmapi.SchedulerConfig(capacity_scheduler_policy=policy),
        "enable_chunked_prefill": runtime.enable_chunked_context,
        "speculative_config": spec,
        # TensorRT-LLM's speculative decoding examples run with the overlap scheduler off.
        "disable_overlap_scheduler": spec is not None,
    }
    if runtime.max_seq_len is not None:
        args["max_seq_len"] = runtime.max_seq_len
    return args


def checkpoint_max_len(path: Path) -> int | None:
    config_file = path / "config.json"
    if not config_file.is_file():
        return None
    value = json.loads(config_file.read_text(encoding="utf-8")).get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


class LlmApiEngine:
    """An EngineClient over ``tensorrt_llm.LLM``."""

    def __init__(
        self,
        llm: Any,
        sampling_params: Callable[..., Any],
        tokenizer: HFTokenizer,
        info: ModelInfo,
        *,
        max_batch_size: int,
        max_queue_size: int | None,
    ) -> None:
        self.tokenizer: Tokenizer = tokenizer
        self.info = info
        self._end_id = tokenizer.eos_token_id
        self.executor_stats: Callable[[], list[ExecutorSample]] | None = None
        self._llm = llm
        self._sampling_params = sampling_params
        self._capacity = None if max_queue_size is None else max_batch_size + max_queue_size
        self._remaining: dict[str, int] = {}  # tokens each active request may still generate
        self._outputs: dict[str, Any] = {}  # the LLM's stream of each active request
        self._idle = asyncio.Event()  # set while no request is active
        self._idle.set()
        self._stats = GlobalStats()
        self._observer: RequestObserver | None = None
        self._running = False
        # Tokens emitted (all requests together) per second while any request is active; _busy_since: the
        # last output (or the start of the busy period), None while idle, so idle time is not counted.
        self._throughput = ThroughputMeter()
        self._busy_since: float | None = None

    # EngineClient ----------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return self._running

    @property
    def queue_depth(self) -> int:
        return len(self._remaining)

    @property
    def queue_seconds(self) -> float:
        pending = sum(self._remaining.values())
        rate = self._throughput.rate
        return pending / rate if pending and rate else 0.0

    @property
    def stats(self) -> GlobalStats:
        return self._stats

    @property
    def generation_rate(self) -> float:
        return self._throughput.rate or 0.0

    def attach_observer(self, observer: SchedulerObserver) -> None:
        self._observer = observer if isinstance(observer, RequestObserver) else None

    def generate(self, prompt_ids: list[int], max_tokens: int, params: SamplingParams) -> Generation:
        if not self._running:
            raise EngineStoppedError("the server is shutting down")
        if self._capacity is not None and len(self._remaining) >= self._capacity:
            raise QueueFullError(f"the request queue is full ({self._capacity} requests)")
        request_id = uuid.uuid4().hex
        self._remaining[request_id] = max_tokens
        self._idle.clear()
        if self._busy_since is None:
            self._busy_since = time.perf_counter()
        stats = SeqStats()
        return Generation(self._run(request_id, prompt_ids, max_tokens, params, stats), stats)

    async def start(self) -> None:
        self._running = True

    async def stop(self, timeout: float) -> None:
        """Stop admitting; in-flight streams get ``timeout`` seconds, then are aborted (their streams end with
        ``finish_reason: abort``) before the LLM shuts down."""
        self._running = False
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            for output in list(self._outputs.values()):
                output.abort()
            with contextlib.suppress(TimeoutError):  # the aborted streams end; don't hang on one that won't
                await asyncio.wait_for(self._idle.wait(), _ABORT_WAIT_SECONDS)
        self._llm.shutdown()

    # ------------------------------------------------------------------------------------------
    def _sampling(self, max_tokens: int, params: SamplingParams) -> Any:
        kwargs: dict[str, Any] = {"max_tokens": max_tokens, "detokenize": False}
        if params.greedy:
            kwargs["top_k"] = 1
        else:
            kwargs.update(temperature=params.temperature, top_p=params.top_p)
        if params.seed is not None:
            kwargs["seed"] = params.seed
        if self._end_id is not None:
            kwargs["end_id"] = self._end_id
        return self._sampling_params(**kwargs)

    async def _run(
        self, request_id: str, prompt_ids: list[int], max_tokens: int, params: SamplingParams, stats: SeqStats
    ) -> AsyncGenerator[StepOutput, None]:
        finished = False
        output: Any = None
        try:
            output = self._llm.generate_async(
                list(prompt_ids), sampling_params=self._sampling(max_tokens, params), streaming=True
            )
            self._outputs[request_id] = output
            sent = 0
            async for out in output:
                completion = out.outputs[0]
                token_ids = list(completion.token_ids)
                new, sent = token_ids[sent:], len(token_ids)
                self._account(request_id, len(new), stats)
                finish = None
                if out.finished:
                    finish = _FINISH.get(str(completion.finish_reason), FinishReason.ABORT)
                    self._speculation(completion, stats)
                    finished = True
                yield StepOutput(new, finish, 0, 0)
                if finished:
                    return
            finished = True
            yield StepOutput([], FinishReason.ABORT, 0, 0)  # the stream ended without a final output
        except ExecutorError:
            raise
        except Exception as exc:  # TensorRT-LLM's RequestError & co: one OpenAI error, naming the backend
            raise ExecutorError(BACKEND, str(exc)) from exc
        finally:
            self._remaining.pop(request_id, None)
            self._outputs.pop(request_id, None)
            if not self._remaining:
                self._busy_since = None
                self._idle.set()
            if finished:
                self._stats.requests_finished += 1
            elif output is not None:
                output.abort()  # the client went away: stop generating for it

    def _account(self, request_id: str, n: int, stats: SeqStats) -> None:
        stats.steps += 1
        stats.emitted += n
        self._stats.steps += 1
        self._stats.emitted += n
        if request_id in self._remaining:
            self._remaining[request_id] = max(self._remaining[request_id] - n, 0)
        # Emitted tokens (TensorRT-LLM's accepted draft tokens included) over the busy time since the last
        # output of any request: the replica's aggregate rate, as the scheduler measures it.
        now = time.perf_counter()
        if self._busy_since is not None:
            self._throughput.observe(n, now - self._busy_since)
        self._busy_since = now

    def _speculation(self, completion: Any, stats: SeqStats) -> None:
        """Per-request draft/accept totals, where TensorRT-LLM reports them (``request_perf_metrics``)."""
        metrics = getattr(completion, "request_perf_metrics", None)
        spec = getattr(metrics, "speculative_decoding", None)
        if spec is None:
            return
        drafted, accepted = int(spec.total_draft_tokens), int(spec.total_accepted_draft_tokens)
        stats.drafted, stats.accepted = drafted, accepted
        self._stats.drafted += drafted
        self._stats.accepted += accepted
        if self._observer is not None:
            self._observer.on_request_speculation(drafted, accepted)


def build_llmapi_engine(config: ServerConfig) -> LlmApiEngine:
    if config.speculative.acceptance == Acceptance.LOGITS:
        raise BackendUnavailableError(
            f"speculative.acceptance logits is not available with {BACKEND} (TensorRT-LLM decides acceptance)"
        )
    ids = config.placement.target_device_ids
    if ids != list(range(len(ids))) and "CUDA_VISIBLE_DEVICES" not in os.environ:
        # The LLM API places ranks on devices 0..TP-1 of what it sees: show it exactly the configured GPUs.
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in ids)
    package = import_tensorrt_llm("tensorrt_llm", BACKEND)
    llmapi = import_tensorrt_llm("tensorrt_llm.llmapi", BACKEND)
    tokenizer_path = config.model.tokenizer or config.model.target
    tokenizer = HFTokenizer(tokenizer_path, config.serving.chat_template)
    llm = package.LLM(**llm_arguments(llmapi, config, tokenizer_path))
    runtime = config.runtime
    max_len = (
        config.model.max_model_len or runtime.max_seq_len or checkpoint_max_len(config.model.target) or 4096
    )
    log.info(
        "trtllm-llmapi: %s, method %s, draft length %d, TP %d",
        config.model.target,
        config.method.value,
        draft_len(config),
        len(config.placement.target_device_ids),
    )
    return LlmApiEngine(
        llm,
        llmapi.SamplingParams,
        tokenizer,
        model_info(config.model.name, max_len),
        max_batch_size=runtime.max_batch_size,
        max_queue_size=runtime.max_queue_size,
    )
