"""An admitted request: one generation per choice (``n``), their text deltas merged, usage and metrics."""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from specdeploy_server.api.context import ResponseContext
from specdeploy_server.api.contract import CompletionTokensDetails, FinishReasonName, SpeculativeUsage, Usage
from specdeploy_server.api.textstream import StopMatcher
from specdeploy_server.core.types import (
    NO_REQUEST_SPECULATION,
    FinishReason,
    RequestSpeculation,
    SamplingParams,
    StepOutput,
    TokenLogprob,
)
from specdeploy_server.engine import Generation
from specdeploy_server.grammar import GrammarConstraint

_FINISH: dict[FinishReason, FinishReasonName] = {
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.ABORT: "abort",
}


@dataclass(frozen=True)
class Prepared:
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    stops: list[str]
    include_usage: bool
    n: int = 1
    #: the grammar every choice follows (structured output, tool calls), copied per choice; or None
    constraint: GrammarConstraint | None = None
    #: completions ``echo``: the prompt's text goes before each choice's text
    echo: bool = False
    #: chat tools: "forced" (the output is one call: ``tool_choice`` required or named), "auto" (the model may
    #: call one; its output is parsed for calls), or None
    tool_mode: str | None = None
    tool_names: frozenset[str] = frozenset()
    #: the prompt's own logprobs (``echo`` with ``logprobs``), first token None
    prompt_logprobs: list[TokenLogprob | None] | None = None
    prompt_text: str = ""
    #: ``skip_special_tokens``: special tokens (end of sequence, ...) are left out of the text
    skip_special_tokens: bool = True
    #: ``include_stop_str_in_output``: the stop string that ended a choice stays in its text
    include_stop_str: bool = False
    #: the request's prediction (target tokens) and draft-length cap
    speculation: RequestSpeculation = NO_REQUEST_SPECULATION
    #: the request carried a prediction: usage reports completion_tokens_details
    predicted: bool = False
    #: ``stream_options.continuous_usage_stats`` with ``include_usage``: each chunk carries the usage so far
    continuous_usage: bool = False


@dataclass
class Delta:
    text: str
    finish_reason: FinishReasonName | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None


class ChoiceRun:
    """One generation (one choice): token outputs -> text deltas, with stop strings and metrics."""

    def __init__(self, index: int, generation: Generation, run: Run) -> None:
        self.index = index
        self.generation = generation
        self._run = run
        self.completion_tokens = 0
        #: of those, draft tokens taken from the prediction and accepted
        self.prediction_accepted = 0
        self._itl: LatencyTally | None = None

    def stepper(self) -> Callable[[StepOutput], tuple[str, FinishReasonName | None, int]]:
        """``step(output) -> (text, finish_reason, kept)``: the text an engine output adds (stop strings cut,
        incomplete characters held back), the choice's finish reason once it is over (None before), and how
        many of the output's tokens count: all of them, except when a stop string ends inside a step of
        several tokens (speculation): the tokens after the one that completed it are dropped, so that usage
        and logprobs are those of decoding one token at a time, whatever was accepted in a step. The TTFT/ITL
        metrics are kept. Everything it needs is bound here, once per choice: the streaming loop calls it once
        per event."""
        metrics = self._run.metrics
        ttft = metrics.ttft
        itl = self._itl = LatencyTally(metrics.itl)
        prepared = self._run.prepared
        decoder = self._run.context.decoder(prepared.skip_special_tokens)
        feed, decoder_flush = decoder.feed, decoder.flush
        stopper = StopMatcher(prepared.stops, prepared.include_stop_str)
        stop_feed = stopper.feed

        def stopped() -> bool:  # a call, not an attribute read, for mypy: feeding the stopper changes it
            return stopper.stopped

        stops = bool(stopper.stops)
        min_tokens = prepared.params.min_tokens
        started = self._run.started
        last = started
        clock = time.perf_counter

        def step(out: StepOutput) -> tuple[str, FinishReasonName | None, int]:
            nonlocal last
            ids = out.token_ids
            n = len(ids)
            text = ""
            if n:
                if stops:  # token by token: the stop string's last token is the last one that counts
                    for i, token in enumerate(ids):
                        if self.completion_tokens + i < min_tokens:  # stop strings count after min_tokens
                            text += feed((token,))
                            continue
                        text += stop_feed(feed((token,)))
                        if stopped():
                            n = i + 1
                            break
                else:
                    text = feed(ids)
                now = clock()
                if self.completion_tokens:
                    itl.observe((now - last) / n, n, now)
                else:
                    ttft.observe(now - started)
                last = now
                self.completion_tokens += n
                if out.prediction_accepted:  # the accepted draft tokens lead the step's tokens
                    self.prediction_accepted += min(out.prediction_accepted, n)
            if stops and stopped():
                return text, "stop", n
            reason = out.finish_reason
            if reason is None:
                return text, None, n
            if not stops:
                return text + decoder_flush(), _FINISH[reason], n
            text += stop_feed(decoder_flush())
            return (text, "stop", n) if stopped() else (text + stopper.flush(), _FINISH[reason], n)

        return step

    @contextlib.asynccontextmanager
    async def opened(self, whole: Run | None = None) -> AsyncIterator[AsyncIterator[StepOutput]]:
        """The generation's outputs, closed however the caller stops reading them; with ``whole``, this is
        the request's only choice and also keeps the request's metrics."""
        if whole is not None:
            whole.begin()
        try:
            async with contextlib.aclosing(self.generation.outputs) as outputs:
                yield outputs
        finally:
            if self._itl is not None:
                self._itl.flush()
            if whole is not None:
                whole.end()

    async def deltas(self, whole: Run | None = None) -> AsyncIterator[tuple[int, Delta]]:
        """This choice's deltas, tagged with its index; ``whole`` as for :meth:`opened`."""
        step = self.stepper()
        index = self.index
        async with self.opened(whole) as outputs:
            async for out in outputs:
                text, finish, kept = step(out)
                ids, logprobs = kept_outputs(out, kept)
                if finish is not None:
                    yield index, Delta(text, finish, ids, logprobs)
                    return
                if text or ids:
                    yield index, Delta(text, None, ids, logprobs)


def kept_outputs(out: StepOutput, kept: int) -> tuple[list[int], list[TokenLogprob] | None]:
    """The token ids and logprobs of an engine output that count (``kept``: what the stepper said)."""
    ids, logprobs = out.token_ids, out.logprobs
    if kept == len(ids):
        return ids, logprobs
    return ids[:kept], None if logprobs is None else logprobs[:kept]


class LatencyTally:
    """A request's inter-token latencies, counted into a histogram child (prometheus_client's) in batches:
    ``observe(value, times, now)`` counts ``times`` observations of ``value`` (the inter-token latency of the
    tokens of one step) as that many ``observe`` calls would, but into plain per-bucket counts of this
    request; they reach the histogram at ``flush`` (the end of the request) and whenever ``FLUSH_SECONDS``
    have passed since the last time, so a scrape misses at most that much of a running stream. A histogram
    whose internals are not as expected gets each observation at once, ``times`` times."""

    FLUSH_SECONDS = 1.0

    def __init__(self, histogram: Any) -> None:
        self._histogram = histogram
        buckets = getattr(histogram, "_buckets", None)
        bounds = getattr(histogram, "_upper_bounds", None)
        total = getattr(histogram, "_sum", None)
        self._direct = buckets is None or bounds is None or total is None or len(buckets) != len(bounds)
        self._buckets: list[Any] = [] if self._direct else list(buckets or [])
        self._bounds: list[float] = [] if self._direct else list(bounds or [])
        self._total = total
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._pending = 0
        self._flushed = time.perf_counter()

    def observe(self, value: float, times: int, now: float) -> None:
        if self._direct:
            for _ in range(times):
                self._histogram.observe(value)
            return
        self._counts[bisect.bisect_left(self._bounds, value)] += times
        self._sum += value * times
        self._pending += times
        if now - self._flushed >= self.FLUSH_SECONDS:
            self.flush(now)

    def flush(self, now: float | None = None) -> None:
        self._flushed = time.perf_counter() if now is None else now
        if not self._pending:
            return
        assert self._total is not None
        self._total.inc(self._sum)
        for bucket, count in zip(self._buckets, self._counts, strict=True):
            if count:
                bucket.inc(count)
        self._counts = [0] * len(self._bounds)
        self._sum = 0.0
        self._pending = 0


class Run:
    """One admitted request: ``n`` choices generating side by side."""

    def __init__(self, prepared: Prepared, generations: list[Generation], context: ResponseContext) -> None:
        self.prepared = prepared
        self.context = context
        self.metrics = context.request_metrics()
        self.started = time.perf_counter()
        self.choices = [ChoiceRun(i, g, self) for i, g in enumerate(generations)]

    @property
    def prompt_tokens(self) -> int:
        return len(self.prepared.prompt_ids)

    @property
    def completion_tokens(self) -> int:
        return sum(c.completion_tokens for c in self.choices)

    async def close(self) -> None:
        """End every choice, whether or not its outputs were ever read (the HTTP layer calls it when the
        response is over, however it ended)."""
        for choice in self.choices:
            await choice.generation.close()

    def usage(self) -> Usage:
        usage = Usage(
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self.completion_tokens,
            total_tokens=self.prompt_tokens + self.completion_tokens,
        )
        if self.prepared.predicted:
            usage.completion_tokens_details = self.prediction_details()
        return usage

    def prediction_details(self) -> CompletionTokensDetails:
        """Per choice, every prediction token either appeared in the completion (a draft token accepted and
        kept) or did not; summed over the choices."""
        size = len(self.prepared.speculation.prediction)
        accepted = [c.prediction_accepted for c in self.choices]
        return CompletionTokensDetails(
            accepted_prediction_tokens=sum(accepted),
            rejected_prediction_tokens=sum(max(size - a, 0) for a in accepted),
        )

    def speculative(self) -> SpeculativeUsage:
        stats = [c.generation.stats for c in self.choices]
        return SpeculativeUsage(
            steps=sum(s.steps for s in stats),
            draft_tokens=sum(s.drafted for s in stats),
            accepted_draft_tokens=sum(s.accepted for s in stats),
            forced_tokens=sum(s.forced for s in stats),
        )

    def begin(self) -> None:
        self.metrics.in_flight.inc()

    def end(self) -> None:
        metrics = self.metrics
        metrics.in_flight.dec()
        metrics.prompt_tokens.inc(self.prompt_tokens)
        metrics.generation_tokens.inc(self.completion_tokens)
        metrics.e2e.observe(time.perf_counter() - self.started)

    def deltas(self) -> AsyncIterator[tuple[int, Delta]]:
        """Every choice's deltas as they come, tagged with the choice's index."""
        if len(self.choices) == 1:
            return self.choices[0].deltas(whole=self)
        return self._merged()

    async def _merged(self) -> AsyncIterator[tuple[int, Delta]]:
        self.begin()
        try:
            async for item in _merge([c.deltas() for c in self.choices]):
                yield item
        finally:
            self.end()


async def _merge(streams: list[AsyncIterator[tuple[int, Delta]]]) -> AsyncIterator[tuple[int, Delta]]:
    """Interleave async iterators as their items arrive; on exit (done, failed or closed early) every
    iterator is closed."""
    pending: dict[asyncio.Future[tuple[int, Delta]], int] = {
        asyncio.ensure_future(anext(s)): i for i, s in enumerate(streams)
    }
    try:
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for fut in sorted(done, key=lambda f: pending[f]):
                index = pending.pop(fut)
                try:
                    item = fut.result()
                except StopAsyncIteration:
                    continue
                yield item
                pending[asyncio.ensure_future(anext(streams[index]))] = index
    finally:
        for fut in pending:
            fut.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        for stream in streams:
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
