"""Backend ``trtllm-engine``: TensorRT-LLM engines run by the executor (``tensorrt_llm.bindings.executor``).

Two executors live in this one process, both in orchestrator mode with their own ``device_ids``: the target
engine, and the draft engine when the method is ``draftTarget``. The speculative core drives them, one batched
call per executor per step, exactly as TensorRT-LLM's own draft-target loop (``examples/run.py``) does:

* draft: ``Request(prefix, max_tokens=k)``, returning generation logits when acceptance is by logits;
* target: ``Request(prefix, max_tokens=k + 1, external_draft_tokens_config=ExternalDraftTokensConfig(tokens,
  logits))``; its output starts with the accepted draft tokens, then one token of the target's own. How many
  were accepted is counted as TensorRT-LLM's own loop counts it: by comparing the output with the draft,
  position by position (prefix match), not from the output's length; anything after the target's own token
  (an executor that keeps decoding up to ``max_tokens``) is dropped, so a step is always accepted + 1.

Every step is a new request carrying the whole prefix; KV block reuse (engines built with paged context FMHA)
makes that cheap. Prompt lookup uses the core's n-gram drafter against the target alone. Cancelling a sequence
cancels its executor requests still in flight (``cancel_request``); requests already answered as final are
forgotten at once, and nothing is cancelled once the executor is shut down.

Draft logits are the draft engine's generation logits, as wide as its padded vocabulary (``vocab_size``
rounded up to a multiple of its tp x pp); the target wants its own padded width. A wider draft row is cut to
the target's width (the extra columns are padding); a narrower one is refused at start-up (``engine_config``).

This module is thin glue over the bindings; the bindings are imported lazily, after the engines' config.json
passed the checks in ``engine_config``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy_server.backends.engine_config import EngineFacts, EngineSetup, check_engines
from specdeploy_server.backends.errors import import_tensorrt_llm
from specdeploy_server.backends.trtllm_executor_client import ExecutorClient
from specdeploy_server.config import Acceptance, Method, RuntimeConfig, ServerConfig
from specdeploy_server.core.drafters import Drafter, DraftModelDrafter, NoDrafter, PromptLookupDrafter
from specdeploy_server.core.executors import (
    AcceptanceRule,
    DraftRequest,
    ExecutorError,
    RequestErrors,
    VerifyRequest,
)
from specdeploy_server.core.scheduler import SchedulerObserver, SchedulerSettings, SpeculativeScheduler
from specdeploy_server.core.types import Proposal, SequenceState
from specdeploy_server.engine import Engine, ExecutorSample, model_info
from specdeploy_server.tokenizer import HFTokenizer

log = logging.getLogger(__name__)

BACKEND = "trtllm-engine"
#: DynamicBatchConfig's moving-average window when runtime tuning is on (our choice)
DYNAMIC_BATCH_WINDOW = 128
_END_ID = "END_ID"  # FinishReason name


# --------------------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class RequestFactory:
    """Builds bindings Requests for one model."""

    bindings: Any
    end_id: int
    pad_id: int
    #: the target's padded vocabulary: draft logits rows are cut to it (None: handed over as they are)
    logits_width: int | None = None

    def sampling(self, seq: SequenceState, greedy: bool) -> Any:
        b = self.bindings
        if greedy:
            return b.SamplingConfig(beam_width=1, top_k=1)
        params = seq.params
        # A fresh seed per request from the sequence's generator: reproducible under a user seed, and
        # independent from step to step (re-using one seed each step would correlate the draws).
        return b.SamplingConfig(
            beam_width=1,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=int(seq.rng.integers(0, 2**63 - 1)),
        )

    def request(
        self,
        seq: SequenceState,
        max_tokens: int,
        *,
        greedy: bool,
        return_logits: bool = False,
        draft: Proposal | None = None,
        use_logits: bool = False,
    ) -> Any:
        b = self.bindings
        external = None
        if draft is not None and draft.tokens:  # the bindings refuse an empty draft
            logits = None
            if use_logits and draft.native_logits is not None:
                logits = self.draft_logits(draft.native_logits, len(draft.tokens))
            external = b.ExternalDraftTokensConfig(list(draft.tokens), logits)
        return b.Request(
            input_token_ids=list(seq.token_ids),
            max_tokens=max_tokens,
            streaming=False,
            sampling_config=self.sampling(seq, greedy),
            output_config=b.OutputConfig(
                return_generation_logits=return_logits, exclude_input_from_output=True
            ),
            end_id=self.end_id,
            pad_id=self.pad_id,
            external_draft_tokens_config=external,
        )

    def draft_logits(self, logits: Any, num_tokens: int) -> Any:
        """``[num_tokens, vocab]`` draft logits as the target takes them: one row per draft token, columns cut
        to the target's padded vocabulary (those beyond it are the draft engine's own padding)."""
        rows = logits[:num_tokens]
        if self.logits_width is not None and rows.shape[-1] > self.logits_width:
            rows = rows[:, : self.logits_width]
        return rows


def accepted_prefix(draft: Sequence[int], output: Sequence[int]) -> int:
    """How many draft tokens the target accepted: the length of the common prefix of the draft and the
    target's output, as TensorRT-LLM's own draft-target loop counts it (the target's first own token differs
    from the draft token at that position, whichever acceptance rule it used)."""
    accepted = 0
    for drafted, emitted in zip(draft, output, strict=False):
        if drafted != emitted:
            break
        accepted += 1
    return accepted


def _raise_failures(name: str, failures: dict[str, str]) -> None:
    if failures:
        raise RequestErrors({seq: ExecutorError(name, message) for seq, message in failures.items()})


class TrtDraftExecutor:
    """DraftExecutor over a draft engine: one request of ``max_tokens = k`` per sequence."""

    def __init__(self, client: ExecutorClient, requests: RequestFactory) -> None:
        self.client = client
        self.requests = requests

    async def draft(self, batch: Sequence[DraftRequest]) -> list[Proposal]:
        # Draft tokens are sampled from the (processed) draft distribution only when acceptance is by
        # logits; otherwise they are the draft's argmax, as in the reference backend.
        sample = [r.want_probs and not r.seq.params.greedy for r in batch]
        outcomes = await self.client.run(
            [
                (
                    r.seq.request_id,
                    self.requests.request(r.seq, r.num_tokens, greedy=not s, return_logits=s),
                )
                for r, s in zip(batch, sample, strict=True)
            ]
        )
        proposals: list[Proposal] = []
        failures: dict[str, str] = {}
        for r, s, outcome in zip(batch, sample, outcomes, strict=True):
            if outcome.error is not None and not (outcome.cancelled or r.seq.cancelled):
                failures[r.seq.request_id] = outcome.error
            tokens = outcome.tokens[: r.num_tokens]
            logits = None
            if s and outcome.logits is not None and tokens:
                logits = outcome.logits[0][: len(tokens)]  # beam 0: [tokens, vocab]
            proposals.append(Proposal(tokens, native_logits=logits))
        _raise_failures(self.client.name, failures)
        return proposals

    def cancel(self, request_id: str) -> None:  # CancelsInFlight: an aborted request's executor requests
        self.client.cancel(request_id)

    def release(self, request_id: str) -> None:
        self.client.cancel(request_id)


class TrtTargetExecutor:
    """TargetExecutor over the target engine: verifies external draft tokens
    (``ExternalDraftTokensConfig``)."""

    def __init__(self, client: ExecutorClient, requests: RequestFactory, max_draft_len: int) -> None:
        self.client = client
        self.requests = requests
        self._max_draft_len = max_draft_len

    @property
    def max_draft_len(self) -> int:
        return self._max_draft_len

    async def verify(self, batch: Sequence[VerifyRequest]) -> list[list[int]]:
        outcomes = await self.client.run(
            [
                (
                    r.seq.request_id,
                    self.requests.request(
                        r.seq,
                        len(r.proposal.tokens) + 1,
                        greedy=r.seq.params.greedy,
                        draft=r.proposal,
                        use_logits=r.acceptance == AcceptanceRule.LOGITS and not r.seq.params.greedy,
                    ),
                )
                for r in batch
            ]
        )
        emitted: list[list[int]] = []
        failures: dict[str, str] = {}
        end_id = self.requests.end_id
        for r, outcome in zip(batch, outcomes, strict=True):
            if outcome.cancelled or r.seq.cancelled:
                emitted.append([])  # the scheduler drops cancelled sequences; nothing to account
                continue
            if outcome.error is not None:
                failures[r.seq.request_id] = outcome.error
                emitted.append([])
                continue
            # The accepted draft tokens and the target's own next token; the scheduler counts len - 1 of them
            # as accepted, so anything the executor returned beyond (it kept decoding) is not handed on.
            keep = accepted_prefix(r.proposal.tokens, outcome.tokens) + 1
            tokens = outcome.tokens[:keep]
            ended = len(outcome.tokens) <= keep and outcome.finish == _END_ID
            if ended and (not tokens or tokens[-1] != end_id):
                tokens.append(end_id)  # the sequence ended: make the stop visible to the scheduler
            if not tokens:
                failures[r.seq.request_id] = (
                    f"no output token (finish reason {outcome.finish}) for a prefix of {len(r.seq.token_ids)}"
                )
            emitted.append(tokens)
        _raise_failures(self.client.name, failures)
        return emitted

    def cancel(self, request_id: str) -> None:  # CancelsInFlight: an aborted request's executor requests
        self.client.cancel(request_id)

    def release(self, request_id: str) -> None:
        self.client.cancel(request_id)


# --------------------------------------------------------------------------------------------- building
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

    try:
        # The target first: each executor's KV cache takes its fraction of the memory free when it starts.
        target = TrtTargetExecutor(
            start(setup.target, placement.target_device_ids, runtime.kv_cache_free_gpu_mem_fraction, False),
            requests,
            setup.max_draft_len,
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
        model_info(config.model.name, setup.max_model_len, setup.target.vocab_size, backend="trtllm-engine"),
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
