"""Backend ``trtllm-llmapi``: TensorRT-LLM's LLM API (``tensorrt_llm.LLM``, PyTorch backend).

TensorRT-LLM runs the speculation itself here (``speculative_config``: ``Eagle3``/``Eagle``, ``NGram``,
``DraftTarget``, ``MTP``), so our scheduler is not involved: this engine streams ``generate_async`` outputs
into the same serving layer, with the same admission rules (``maxBatchSize`` running + ``maxQueueSize``
waiting, then 503) and the same load figures for autoscaling. Checkpoints are Hugging Face directories;
nothing is built.

Stopping: ``end_id`` is left unset, so TensorRT-LLM's own ``SamplingParams`` setup takes the model's end ids;
every end-of-sequence id of our tokenizer is also sent as ``stop_token_ids``, kept in the output.

Acceptance: the draft/accepted counts come from our drafter where it runs in this process, else from
TensorRT-LLM's request perf metrics (every request sets ``return_perf_metrics``) where they are real, else
from the stream (``llmapi_acceptance``). Pass costs and sequence steps come from the executor's iteration
statistics, read by a thread while the engine runs (``llmapi_step_costs``). Building the engine from the
configuration: ``llmapi_build``.

Request fields: penalties, ``top_k`` and ``min_p`` go into ``SamplingParams``; structured output into
``guided_decoding`` (``GuidedDecodingParams``), with the LLM's ``guided_decoding_backend`` llguidance.
TensorRT-LLM masks the target's logits at every draft position itself, with every speculative method we
render.
``logit_bias``, ``logprobs`` and raw llguidance grammars are refused (``FEATURES``).

promptLookup runs our own drafter inside TensorRT-LLM (``llmapi_drafter``, ``UserProvidedDecodingConfig``)
where the version has user-provided drafters; with ``TLLM_WORKER_USE_SINGLE_PROCESS=1`` each request's
prediction and draft-length cap reach it by the request's LLM API id (``HINTED_FEATURES``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

from prometheus_client import CollectorRegistry

from specdeploy_server.backends.llmapi_acceptance import (
    AcceptanceSources,
    RequestObserver,
    StreamCounts,
    request_acceptance,
)
from specdeploy_server.backends.llmapi_args import (
    BACKEND,
)
from specdeploy_server.backends.llmapi_drafter import RequestHints
from specdeploy_server.backends.llmapi_step_costs import (
    IterationObserver,
    IterationStatsReader,
    StepCostCollector,
)
from specdeploy_server.core.executors import ExecutorError
from specdeploy_server.core.load import ThroughputMeter
from specdeploy_server.core.scheduler import (
    EngineStoppedError,
    GlobalStats,
    QueueFullError,
    SchedulerObserver,
)
from specdeploy_server.core.types import (
    NO_REQUEST_SPECULATION,
    FinishReason,
    RequestSpeculation,
    SamplingParams,
    SeqStats,
    StepOutput,
    TokenConstraint,
)
from specdeploy_server.engine import (
    ExecutorSample,
    Feature,
    Generation,
    ModelInfo,
    check_features,
)
from specdeploy_server.grammar import Guide
from specdeploy_server.tokenizer import HFTokenizer, Tokenizer

log = logging.getLogger(__name__)

# 'cancelled' (abort()) and 'timeout' end a stream early: abort.
_FINISH = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}
_ABORT_WAIT_SECONDS = 1.0  # how long aborted streams get to end before the LLM shuts down
#: what this backend passes to TensorRT-LLM (SamplingParams' penalties, top_k, min_p; guided_decoding for
#: json_object, json_schema, Lark and tools); logit_bias, logprobs and raw llguidance grammars are refused
FEATURES = frozenset({Feature.PENALTIES, Feature.FILTERS, Feature.GRAMMAR})
#: with our drafter in TensorRT-LLM's executor in this process (llmapi_drafter): predictions, per-request caps
HINTED_FEATURES = frozenset({Feature.PREDICTION, Feature.SPECULATION_CONTROL})


class LlmApiEngine:
    """An EngineClient over ``tensorrt_llm.LLM``."""

    def __init__(
        self,
        llm: Any,
        sampling_params: Callable[..., Any],
        guided_decoding_params: Callable[[Guide], Any],
        tokenizer: HFTokenizer,
        info: ModelInfo,
        *,
        max_batch_size: int,
        max_queue_size: int | None,
        draft_len: int = 0,
        hints: RequestHints | None = None,
        step_costs: StepCostCollector | None = None,
    ) -> None:
        self.tokenizer: Tokenizer = tokenizer
        self.info = info
        self._stop_ids = sorted(tokenizer.eos_token_ids)
        self._draft_len = draft_len  # tokens TensorRT-LLM drafts per generation step (0: not speculating)
        #: our drafter's channel (predictions, per-request caps), where it runs in this process
        self._hints = hints
        self.acceptance_sources = AcceptanceSources(info.served_model_name)
        self.executor_stats: Callable[[], list[ExecutorSample]] | None = None
        self._llm = llm
        self._sampling_params = sampling_params
        self._guided = guided_decoding_params
        # maxQueueSize 0 or None: no limit, as in TensorRT-LLM's executor
        self._capacity = max_batch_size + max_queue_size if max_queue_size else None
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
        # the executor's iteration statistics, read while running
        self._iterations = None if step_costs is None else IterationStatsReader(self._read_stats, step_costs)

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

    def queue_full(self) -> bool:
        """The LLM holds ``maxBatchSize + maxQueueSize`` requests (running or queued in its executor)."""
        return self._capacity is not None and len(self._remaining) >= self._capacity

    @property
    def stats(self) -> GlobalStats:
        return self._stats

    @property
    def generation_rate(self) -> float:
        return self._throughput.rate or 0.0

    def attach_observer(self, observer: SchedulerObserver) -> None:
        self._observer = observer if isinstance(observer, RequestObserver) else None
        # The server's metrics (ServerMetrics.registry): say there where acceptance figures come from.
        registry = getattr(observer, "registry", None)
        if isinstance(registry, CollectorRegistry) and self._draft_len > 0:
            self.acceptance_sources.model = str(getattr(observer, "model", self.acceptance_sources.model))
            registry.register(self.acceptance_sources)
        if self._iterations is not None:
            if isinstance(registry, CollectorRegistry):
                self._iterations.collector.model = self.acceptance_sources.model
                registry.register(self._iterations.collector)
            self._iterations.observer = observer if isinstance(observer, IterationObserver) else None

    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        params: SamplingParams,
        constraint: TokenConstraint | None = None,
        speculation: RequestSpeculation = NO_REQUEST_SPECULATION,
    ) -> Generation:
        # the serving layer refuses these with a 400 first
        check_features(self.info, params, constraint, speculation)
        if not self._running:
            raise EngineStoppedError("the server is shutting down")
        if self.queue_full():
            raise QueueFullError(f"the request queue is full ({self._capacity} requests)")
        request_id = uuid.uuid4().hex
        self._remaining[request_id] = max_tokens
        self._idle.clear()
        if self._busy_since is None:
            self._busy_since = time.perf_counter()
        stats = SeqStats()
        guide = getattr(constraint, "guide", None)
        outputs = self._run(
            request_id, prompt_ids, lambda: self._sampling(max_tokens, params, guide), stats, speculation
        )
        return Generation(outputs, stats, lambda: self._forget(request_id))

    def _forget(self, request_id: str) -> None:
        """A generation given up before its outputs were read (its ``finally`` never ran): free its place."""
        if self._remaining.pop(request_id, None) is not None and not self._remaining:
            self._busy_since = None
            self._idle.set()

    async def start(self) -> None:
        self._running = True
        if self._iterations is not None:
            self._iterations.start()

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
        if self._iterations is not None:
            await asyncio.to_thread(self._iterations.stop)
        self._llm.shutdown()

    def _read_stats(self, timeout: float) -> list[Any]:
        return list(self._llm.get_stats(timeout=timeout))

    # ------------------------------------------------------------------------------------------
    def _sampling(self, max_tokens: int, params: SamplingParams, guide: Guide | None) -> Any:
        # No end_id: given one, TensorRT-LLM skips its own setup of the model's end ids and pad id.
        kwargs: dict[str, Any] = {
            "max_tokens": max_tokens,
            "detokenize": False,
            "return_perf_metrics": True,
        }
        if self._stop_ids:
            kwargs.update(stop_token_ids=list(self._stop_ids), include_stop_str_in_output=True)
        if params.greedy:
            kwargs["top_k"] = 1
        else:
            kwargs.update(temperature=params.temperature, top_p=params.top_p)
            if params.top_k > 0:
                kwargs["top_k"] = params.top_k
            if params.min_p > 0.0:
                kwargs["min_p"] = params.min_p
        if params.seed is not None:
            kwargs["seed"] = params.seed
        # TensorRT-LLM's defaults (None) are no penalty: only set what the request changes.
        if params.repetition_penalty != 1.0:
            kwargs["repetition_penalty"] = params.repetition_penalty
        if params.presence_penalty:
            kwargs["presence_penalty"] = params.presence_penalty
        if params.frequency_penalty:
            kwargs["frequency_penalty"] = params.frequency_penalty
        if guide is not None:
            kwargs["guided_decoding"] = self._guided(guide)
        return self._sampling_params(**kwargs)

    async def _run(
        self,
        request_id: str,
        prompt_ids: list[int],
        sampling: Callable[[], Any],
        stats: SeqStats,
        speculation: RequestSpeculation,
    ) -> AsyncGenerator[StepOutput, None]:
        finished = False
        output: Any = None
        client_id: int | None = None
        try:
            output = self._llm.generate_async(list(prompt_ids), sampling_params=sampling(), streaming=True)
            self._outputs[request_id] = output
            if self._hints is not None:
                # the LLM API request's id, the executor request's py_client_id; registered before the
                # request's first generation step (its first iteration is the context step, not drafted),
                # so that the drafter sees its speculation and counts what it drafts for it
                client_id = int(output.request_id)
                self._hints.register(client_id, speculation)
            sent = 0
            counts = StreamCounts()
            async for out in output:
                completion = out.outputs[0]
                token_ids = list(completion.token_ids)
                new, at_len, sent = token_ids[sent:], len(prompt_ids) + sent, len(token_ids)
                predicted = 0
                if client_id is not None and self._hints is not None:
                    predicted = self._hints.prediction_accepted(client_id, at_len, new)
                counts.observe(len(new))
                self._account(request_id, len(new), stats)
                finish = None
                if out.finished:
                    finish = _FINISH.get(str(completion.finish_reason), FinishReason.ABORT)
                    proposed = None
                    if client_id is not None and self._hints is not None:
                        proposed = self._hints.drafted(client_id)
                    self._speculation(completion, counts, stats, proposed)
                    finished = True
                yield StepOutput(new, finish, 0, 0, prediction_accepted=predicted)
                if finished:
                    return
            finished = True
            yield StepOutput([], FinishReason.ABORT, 0, 0)  # the stream ended without a final output
        except ExecutorError:
            raise
        except Exception as exc:  # TensorRT-LLM's RequestError & co: one OpenAI error, naming the backend
            raise ExecutorError(BACKEND, str(exc)) from exc
        finally:
            if client_id is not None and self._hints is not None:
                self._hints.drop(client_id)
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

    def _speculation(
        self, completion: Any, counts: StreamCounts, stats: SeqStats, proposed: int | None
    ) -> None:
        """Per-request draft/accept totals: what our drafter proposed where it counted, else TensorRT-LLM's
        ``request_perf_metrics`` where they are real, else what the stream showed."""
        if self._draft_len <= 0:
            return
        source, drafted, accepted = request_acceptance(completion, counts, self._draft_len, proposed)
        self.acceptance_sources.counts[source] += 1
        if drafted <= 0:
            return
        stats.drafted, stats.accepted = drafted, accepted
        self._stats.drafted += drafted
        self._stats.accepted += accepted
        if self._observer is not None:
            self._observer.on_request_speculation(drafted, accepted)
