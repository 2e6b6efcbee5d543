"""The engine the serving layer talks to: tokenizer + scheduler + model facts, behind one small protocol."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from specdeploy_server.core.scheduler import GlobalStats, SchedulerObserver, SpeculativeScheduler
from specdeploy_server.core.types import (
    NO_REQUEST_SPECULATION,
    RequestSpeculation,
    SamplingParams,
    SeqStats,
    SequenceState,
    StepOutput,
    TokenConstraint,
    TokenLogprob,
)
from specdeploy_server.tokenizer import Tokenizer


@dataclass(frozen=True)
class ExecutorSample:
    """The latest iteration statistics of one model executor (TensorRT-LLM ``IterationStats``)."""

    executor: str  # "target" or "draft"
    active_requests: int
    queued_requests: int
    iteration_seconds: float | None
    kv_blocks_used: int | None
    kv_blocks_free: int | None


class Feature:
    """What an engine can do beyond plain temperature/top-p sampling; the serving layer refuses a request
    that needs a feature its engine lacks (400 naming the field)."""

    PENALTIES = "penalties"  # presence_penalty, frequency_penalty, repetition_penalty
    LOGIT_BIAS = "logit_bias"
    FILTERS = "filters"  # top_k, min_p
    LOGPROBS = "logprobs"  # logprobs of the generated tokens
    PROMPT_LOGPROBS = "prompt_logprobs"  # echo with logprobs
    GRAMMAR = "grammar"  # response_format json_object / json_schema / lark_grammar, tools
    GRAMMAR_LLGUIDANCE = "grammar_llguidance"  # response_format llguidance (a raw llguidance grammar)
    MIN_TOKENS = "min_tokens"  # stop tokens masked until min_tokens are generated
    STOP_TOKENS = "stop_tokens"  # stop_token_ids, ignore_eos: which tokens end a sequence
    PREDICTION = "prediction"  # Predicted Outputs: the request's prediction drafts
    SPECULATION_CONTROL = "speculation_control"  # a request's own cap on its draft length (0: none)


#: every feature: the reference backend applies all of them in the speculative core
ALL_FEATURES = frozenset(
    {
        Feature.PENALTIES,
        Feature.LOGIT_BIAS,
        Feature.FILTERS,
        Feature.LOGPROBS,
        Feature.PROMPT_LOGPROBS,
        Feature.GRAMMAR,
        Feature.GRAMMAR_LLGUIDANCE,
        Feature.MIN_TOKENS,
        Feature.STOP_TOKENS,
        Feature.PREDICTION,
        Feature.SPECULATION_CONTROL,
    }
)


def features_needed(params: SamplingParams, constraint: TokenConstraint | None) -> frozenset[str]:
    """The features a request with these settings needs from its engine."""
    needed = set()
    if params.presence_penalty or params.frequency_penalty or params.repetition_penalty != 1.0:
        needed.add(Feature.PENALTIES)
    if params.logit_bias:
        needed.add(Feature.LOGIT_BIAS)
    if params.top_k > 0 or params.min_p > 0.0:
        needed.add(Feature.FILTERS)
    if params.logprobs is not None:
        needed.add(Feature.LOGPROBS)
    if params.min_tokens > 0:
        needed.add(Feature.MIN_TOKENS)
    if params.stop_token_ids or params.ignore_eos:
        needed.add(Feature.STOP_TOKENS)
    if constraint is not None:
        needed.add(Feature.GRAMMAR)
        guide = getattr(constraint, "guide", None)
        if guide is not None and guide.kind == "llguidance":
            needed.add(Feature.GRAMMAR_LLGUIDANCE)
    return frozenset(needed)


def check_features(
    info: ModelInfo,
    params: SamplingParams,
    constraint: TokenConstraint | None,
    speculation: RequestSpeculation = NO_REQUEST_SPECULATION,
) -> None:
    """Refuse (ValueError) settings the engine would otherwise ignore; the serving layer refuses them
    earlier, with a 400 naming the field."""
    needed = set(features_needed(params, constraint))
    if speculation.prediction:
        needed.add(Feature.PREDICTION)
    if speculation.max_draft_len is not None:
        needed.add(Feature.SPECULATION_CONTROL)
    missing = needed - info.features
    if missing:
        raise ValueError(f"backend {info.backend} does not support: {', '.join(sorted(missing))}")


@dataclass(frozen=True)
class ModelInfo:
    served_model_name: str
    max_model_len: int
    created: int
    vocab_size: int | None = None
    features: frozenset[str] = frozenset()
    #: the backend's name, for error messages
    backend: str = "reference"


@runtime_checkable
class ScoresPrompts(Protocol):
    """An engine that can report the target's log-probabilities of a prompt's tokens (``echo`` +
    ``logprobs``)."""

    async def prompt_logprobs(self, prompt_ids: list[int], top: int) -> list[TokenLogprob]: ...


@dataclass
class Generation:
    """A handle on one running request: its outputs and its statistics.

    ``close()`` ends the request whether or not its outputs were ever iterated (an async generator that was
    never started runs no ``finally`` when closed): whoever gave up on a generation calls it.
    """

    outputs: AsyncGenerator[StepOutput, None]
    stats: SeqStats
    cancel: Callable[[], None] | None = None

    async def close(self) -> None:
        await self.outputs.aclose()
        if self.cancel is not None:
            self.cancel()


class EngineClient(Protocol):
    info: ModelInfo
    tokenizer: Tokenizer

    @property
    def ready(self) -> bool: ...

    @property
    def queue_depth(self) -> int: ...

    @property
    def queue_seconds(self) -> float: ...

    def queue_full(self) -> bool:
        """Whether the next request would be refused with ``QueueFullError`` now; cheap, and touches no model
        (the admission gate asks it before a request's body is read)."""
        ...

    @property
    def stats(self) -> GlobalStats: ...

    @property
    def generation_rate(self) -> float: ...

    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        params: SamplingParams,
        constraint: TokenConstraint | None = None,
        speculation: RequestSpeculation = NO_REQUEST_SPECULATION,
    ) -> Generation: ...

    async def start(self) -> None: ...

    async def stop(self, timeout: float) -> None: ...


@runtime_checkable
class ObservableEngine(Protocol):
    """An engine that reports speculation statistics (and maybe executor statistics) to the metrics."""

    executor_stats: Callable[[], list[ExecutorSample]] | None

    def attach_observer(self, observer: SchedulerObserver) -> None: ...


class Engine:
    """Runs requests through the speculative scheduler."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        scheduler: SpeculativeScheduler,
        info: ModelInfo,
        on_close: Callable[[], None] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.scheduler = scheduler
        self.info = info
        self._on_close = on_close
        #: the executors' own statistics for /metrics (TensorRT-LLM backends), None when there are none
        self.executor_stats: Callable[[], list[ExecutorSample]] | None = None

    def attach_observer(self, observer: SchedulerObserver) -> None:
        self.scheduler.observer = observer

    @property
    def ready(self) -> bool:
        return self.scheduler.alive

    @property
    def queue_depth(self) -> int:
        return self.scheduler.queue_depth

    @property
    def queue_seconds(self) -> float:
        return self.scheduler.queue_seconds

    def queue_full(self) -> bool:
        return self.scheduler.queue_full()

    @property
    def stats(self) -> GlobalStats:
        return self.scheduler.stats

    @property
    def generation_rate(self) -> float:
        return self.scheduler.generation_rate or 0.0

    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        params: SamplingParams,
        constraint: TokenConstraint | None = None,
        speculation: RequestSpeculation = NO_REQUEST_SPECULATION,
    ) -> Generation:
        """Queue a request (raises QueueFullError / EngineStoppedError at once) and return its output
        stream."""
        check_features(self.info, params, constraint, speculation)
        seq = SequenceState(
            request_id=uuid.uuid4().hex,
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            params=params,
            stop_token_ids=params.stops(self.tokenizer.eos_token_ids),
            constraint=constraint,
            speculation=speculation,
        )
        self.scheduler.add(seq)
        return Generation(self._stream(seq), seq.stats, lambda: self.scheduler.abort(seq))

    async def _stream(self, seq: SequenceState) -> AsyncGenerator[StepOutput, None]:
        try:
            while True:
                item = await seq.outputs.get()
                if isinstance(item, BaseException):
                    raise item
                yield item
                if item.finish_reason is not None:
                    return
        finally:
            self.scheduler.abort(seq)  # nothing to do unless it is still waiting or running

    async def prompt_logprobs(self, prompt_ids: list[int], top: int) -> list[TokenLogprob]:
        target = self.scheduler.target
        if not isinstance(target, ScoresPrompts):
            raise NotImplementedError("this backend cannot score prompts")
        return await target.prompt_logprobs(prompt_ids, top)

    async def start(self) -> None:
        self.scheduler.start()

    async def stop(self, timeout: float) -> None:
        await self.scheduler.stop(timeout)
        if self._on_close is not None:
            await asyncio.to_thread(self._on_close)


def model_info(
    name: str,
    max_model_len: int,
    vocab_size: int | None = None,
    features: frozenset[str] = frozenset(),
    backend: str = "reference",
) -> ModelInfo:
    return ModelInfo(name, max_model_len, int(time.time()), vocab_size, features, backend)
