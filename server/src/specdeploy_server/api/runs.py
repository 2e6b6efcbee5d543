"""An admitted request: one generation per choice (``n``), their text deltas merged, usage and metrics."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specdeploy_server.api.textstream import IncrementalDecoder, StopMatcher
from specdeploy_server.core.types import FinishReason, SamplingParams, TokenLogprob
from specdeploy_server.engine import Generation
from specdeploy_server.grammar import GrammarConstraint

if TYPE_CHECKING:
    from specdeploy_server.api.serving import OpenAIServing

_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.ABORT: "abort"}


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


@dataclass
class Delta:
    text: str
    finish_reason: str | None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None


class ChoiceRun:
    """One generation (one choice): token outputs -> text deltas, with stop strings and metrics."""

    def __init__(self, index: int, generation: Generation, run: Run) -> None:
        self.index = index
        self.generation = generation
        self._run = run
        self.completion_tokens = 0

    async def deltas(self, whole: Run | None = None) -> AsyncIterator[tuple[int, Delta]]:
        """This choice's deltas, tagged with its index; with ``whole``, this is the request's only choice and
        also keeps the request's metrics (one generator per event less than a merge)."""
        serving = self._run.serving
        metrics, model = serving.metrics, serving.settings.served_model_name
        ttft, itl = metrics.ttft.labels(model), weighted_observer(metrics.itl.labels(model))
        decoder = IncrementalDecoder(serving.engine.tokenizer)
        stopper = StopMatcher(self._run.prepared.stops)
        started = last = self._run.started
        index = self.index
        if whole is not None:
            whole.begin()
        try:
            async with contextlib.aclosing(self.generation.outputs) as outputs:
                async for out in outputs:
                    now = time.perf_counter()
                    n = len(out.token_ids)
                    if n:
                        if self.completion_tokens == 0:
                            ttft.observe(now - started)
                        else:
                            itl((now - last) / n, n)
                        last = now
                    self.completion_tokens += n
                    text = stopper.feed(decoder.feed(out.token_ids))
                    ids, logprobs = out.token_ids, out.logprobs
                    if stopper.stopped:
                        yield index, Delta(text, "stop", ids, logprobs)
                        return
                    if out.finish_reason is not None:
                        text += stopper.feed(decoder.flush())
                        if not stopper.stopped:
                            text += stopper.flush()
                        finish = "stop" if stopper.stopped else _FINISH[out.finish_reason]
                        yield index, Delta(text, finish, ids, logprobs)
                        return
                    if text or ids:
                        yield index, Delta(text, None, ids, logprobs)
        finally:
            if whole is not None:
                whole.end()


def weighted_observer(histogram: Any) -> Callable[[float, int], None]:
    """``observe(value, times)``: ``times`` observations of ``value`` (the inter-token latency of the tokens
    of one step), counted as that many ``observe`` calls would count them, in one update. prometheus_client's
    histogram child has no weighted ``observe``: its sum and the one bucket are incremented directly where
    they are as expected, else ``observe`` is called ``times`` times. Resolved once per request."""
    buckets = getattr(histogram, "_buckets", None)
    bounds = getattr(histogram, "_upper_bounds", None)
    total = getattr(histogram, "_sum", None)
    if buckets is None or bounds is None or total is None or len(buckets) != len(bounds):

        def repeated(value: float, times: int) -> None:
            for _ in range(times):
                histogram.observe(value)

        return repeated
    pairs = list(zip(bounds, buckets, strict=True))

    def weighted(value: float, times: int) -> None:
        total.inc(value * times)
        for bound, bucket in pairs:
            if value <= bound:
                bucket.inc(times)
                return

    return weighted


class Run:
    """One admitted request: ``n`` choices generating side by side."""

    def __init__(self, prepared: Prepared, generations: list[Generation], serving: OpenAIServing) -> None:
        self.prepared = prepared
        self.serving = serving
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

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def speculative(self) -> dict[str, int]:
        stats = [c.generation.stats for c in self.choices]
        return {
            "steps": sum(s.steps for s in stats),
            "draft_tokens": sum(s.drafted for s in stats),
            "accepted_draft_tokens": sum(s.accepted for s in stats),
            "forced_tokens": sum(s.forced for s in stats),
        }

    def begin(self) -> None:
        serving = self.serving
        serving.metrics.in_flight.labels(serving.settings.served_model_name).inc()

    def end(self) -> None:
        metrics, model = self.serving.metrics, self.serving.settings.served_model_name
        metrics.in_flight.labels(model).dec()
        metrics.prompt_tokens.labels(model).inc(self.prompt_tokens)
        metrics.generation_tokens.labels(model).inc(self.completion_tokens)
        metrics.e2e.labels(model).observe(time.perf_counter() - self.started)

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
