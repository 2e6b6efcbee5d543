"""The logic behind /v1/completions and /v1/chat/completions, over an EngineClient (no HTTP here)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from specdeploy_server.api.errors import (
    BadRequestError,
    ExecutorFailedError,
    ModelNotFoundError,
    OverloadedError,
)
from specdeploy_server.api.protocol import ChatCompletionRequest, CompletionRequest
from specdeploy_server.api.textstream import IncrementalDecoder, StopMatcher
from specdeploy_server.core.executors import ExecutorError
from specdeploy_server.core.scheduler import EngineStoppedError, QueueFullError
from specdeploy_server.core.types import FinishReason, SamplingParams
from specdeploy_server.engine import EngineClient, Generation
from specdeploy_server.metrics import ServerMetrics
from specdeploy_server.tokenizer import ChatTemplateError

_FINISH = {FinishReason.STOP: "stop", FinishReason.LENGTH: "length", FinishReason.ABORT: "abort"}
#: text longer than this is tokenised (or its chat template rendered) on the tokenizer threads, not the loop;
#: shorter text costs less than the thread hop (tens of microseconds)
OFFLOAD_CHARS = 2048
TOKENIZER_THREADS = 2
T = TypeVar("T")


@dataclass(frozen=True)
class ServingSettings:
    served_model_name: str
    default_max_tokens: int = 16


@dataclass(frozen=True)
class Prepared:
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams
    stops: list[str]
    include_usage: bool


@dataclass
class Delta:
    text: str
    finish_reason: str | None


class Run:
    """One admitted request: text deltas out, metrics in."""

    def __init__(self, prepared: Prepared, generation: Generation, serving: OpenAIServing) -> None:
        self.prepared = prepared
        self.generation = generation
        self._serving = serving
        self.completion_tokens = 0
        self.started = time.perf_counter()

    @property
    def prompt_tokens(self) -> int:
        return len(self.prepared.prompt_ids)

    async def close(self) -> None:
        """End the request, whether or not its outputs were ever read (the HTTP layer calls it when the
        response is over, however it ended)."""
        await self.generation.close()

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    async def deltas(self) -> AsyncIterator[Delta]:
        metrics, model = self._serving.metrics, self._serving.settings.served_model_name
        ttft, itl, in_flight = (
            metrics.ttft.labels(model),
            metrics.itl.labels(model),
            metrics.in_flight.labels(model),
        )
        decoder = IncrementalDecoder(self._serving.engine.tokenizer)
        stopper = StopMatcher(self.prepared.stops)
        last = self.started
        in_flight.inc()
        try:
            async with contextlib.aclosing(self.generation.outputs) as outputs:
                async for out in outputs:
                    now = time.perf_counter()
                    n = len(out.token_ids)
                    if n:
                        if self.completion_tokens == 0:
                            ttft.observe(now - self.started)
                        else:
                            gap = (now - last) / n
                            for _ in range(n):
                                itl.observe(gap)
                        last = now
                    self.completion_tokens += n
                    text = stopper.feed(decoder.feed(out.token_ids))
                    if stopper.stopped:
                        yield Delta(text, "stop")
                        return
                    if out.finish_reason is not None:
                        text += stopper.feed(decoder.flush())
                        if not stopper.stopped:
                            text += stopper.flush()
                        yield Delta(text, "stop" if stopper.stopped else _FINISH[out.finish_reason])
                        return
                    if text:
                        yield Delta(text, None)
        finally:
            in_flight.dec()
            metrics.prompt_tokens.labels(model).inc(self.prompt_tokens)
            metrics.generation_tokens.labels(model).inc(self.completion_tokens)
            metrics.e2e.labels(model).observe(time.perf_counter() - self.started)


class OpenAIServing:
    def __init__(self, engine: EngineClient, settings: ServingSettings, metrics: ServerMetrics) -> None:
        self.engine = engine
        self.settings = settings
        self.metrics = metrics
        self._tokenizer_pool: concurrent.futures.ThreadPoolExecutor | None = None

    async def _off_loop(self, size: int, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` on the tokenizer threads when ``size`` (characters) makes it worth it, so a long
        prompt never stalls the step loop or the other streams."""
        if size <= OFFLOAD_CHARS:
            return work(*args)
        if self._tokenizer_pool is None:
            self._tokenizer_pool = concurrent.futures.ThreadPoolExecutor(
                TOKENIZER_THREADS, thread_name_prefix="tokenizer"
            )
        return await asyncio.get_running_loop().run_in_executor(self._tokenizer_pool, work, *args)

    def _precheck(self, chars: int, param: str) -> None:
        """Refuse text that cannot fit the context whatever it tokenises to, before tokenising it: every token
        covers at most ``max_chars_per_token`` characters, so ``chars`` characters are at least
        ``chars / max_chars_per_token`` tokens."""
        per_token = self.engine.tokenizer.max_chars_per_token
        limit = self.engine.info.max_model_len
        if per_token is None or chars <= limit * per_token:
            return
        raise BadRequestError(
            f"This model's maximum context length is {limit} tokens, but the prompt has {chars} characters, "
            f"so at least {-(-chars // per_token)} tokens",
            param=param,
            code="context_length_exceeded",
        )

    def list_models(self) -> dict[str, Any]:
        info = self.engine.info
        return {
            "object": "list",
            "data": [
                {
                    "id": self.settings.served_model_name,
                    "object": "model",
                    "created": info.created,
                    "owned_by": "specdeploy",
                    "max_model_len": info.max_model_len,
                }
            ],
        }

    # ----------------------------------------------------------------- validation
    def _check_common(self, req: CompletionRequest | ChatCompletionRequest) -> None:
        if req.model != self.settings.served_model_name:
            raise ModelNotFoundError(
                f"The model '{req.model}' does not exist; this server serves "
                f"'{self.settings.served_model_name}'",
                param="model",
            )
        unsupported = req.unsupported()
        if unsupported:
            name = unsupported[0]
            detail = " (only n=1 is supported)" if name == "n" else ""
            raise BadRequestError(f"'{name}' is not supported by this server{detail}", param=name)

    def _budget(self, prompt_ids: list[int], requested: int | None, default: int | None, param: str) -> int:
        if not prompt_ids:
            raise BadRequestError("the prompt is empty", param="prompt")
        limit = self.engine.info.max_model_len
        vocab = self.engine.info.vocab_size
        scan = vocab is not None and len(prompt_ids) < limit  # a prompt too long is refused below anyway
        if scan and not 0 <= min(prompt_ids) <= max(prompt_ids) < (vocab or 0):
            raise BadRequestError(f"prompt token ids must be in [0, {vocab})", param="prompt")
        room = limit - len(prompt_ids)
        if requested is not None and requested < 1:
            raise BadRequestError(f"{param} must be at least 1, got {requested}", param=param)
        if room < 1:
            raise BadRequestError(
                f"This model's maximum context length is {limit} tokens, but the prompt has "
                f"{len(prompt_ids)} tokens",
                param="messages" if param == "max_completion_tokens" else "prompt",
                code="context_length_exceeded",
            )
        if requested is None:
            return min(default, room) if default is not None else room
        if requested > room:
            raise BadRequestError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{len(prompt_ids) + requested} tokens ({len(prompt_ids)} in the prompt, {requested} for the "
                f"completion). Please reduce the prompt or {param}.",
                param=param,
                code="context_length_exceeded",
            )
        return requested

    @staticmethod
    def _params(req: CompletionRequest | ChatCompletionRequest) -> SamplingParams:
        return SamplingParams(temperature=req.temperature, top_p=req.top_p, seed=req.seed)

    async def prepare_completion(self, req: CompletionRequest) -> Prepared:
        self._check_common(req)
        ids = await self._prompt_ids(req.prompt)
        max_tokens = self._budget(ids, req.max_tokens, self.settings.default_max_tokens, "max_tokens")
        return Prepared(ids, max_tokens, self._params(req), req.stop_strings(), self._include_usage(req))

    async def _encode(self, text: str) -> list[int]:
        self._precheck(len(text), "prompt")
        return await self._off_loop(len(text), self.engine.tokenizer.encode, text, True)

    async def _prompt_ids(self, prompt: str | list[str] | list[int] | list[list[int]]) -> list[int]:
        if isinstance(prompt, str):
            return await self._encode(prompt)
        if all(isinstance(t, int) for t in prompt):
            return [t for t in prompt if isinstance(t, int)]
        if len(prompt) != 1:
            raise BadRequestError("only one prompt per request is supported", param="prompt")
        first = prompt[0]
        if isinstance(first, str):
            return await self._encode(first)
        if isinstance(first, list):
            return list(first)
        raise BadRequestError(
            "prompt must be a string, a list of token ids, or a list of one of those", "prompt"
        )

    async def prepare_chat(self, req: ChatCompletionRequest) -> Prepared:
        self._check_common(req)
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        chars = sum(len(m["content"]) for m in messages)
        self._precheck(chars, "messages")  # the rendered text holds every message's content, and more
        tokenizer = self.engine.tokenizer
        try:
            text = await self._off_loop(chars, tokenizer.render_chat, messages)
        except ChatTemplateError as exc:
            raise BadRequestError(str(exc), param="messages") from exc
        ids = await self._off_loop(len(text), tokenizer.encode, text, False)
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = self._budget(ids, requested, None, param)
        return Prepared(ids, max_tokens, self._params(req), req.stop_strings(), self._include_usage(req))

    @staticmethod
    def _include_usage(req: CompletionRequest | ChatCompletionRequest) -> bool:
        return bool(req.stream_options and req.stream_options.include_usage)

    def start(self, prepared: Prepared) -> Run:
        try:
            generation = self.engine.generate(prepared.prompt_ids, prepared.max_tokens, prepared.params)
        except QueueFullError as exc:
            raise OverloadedError(str(exc)) from exc
        except EngineStoppedError as exc:
            raise OverloadedError(str(exc), code="shutting_down") from exc
        return Run(prepared, generation, self)

    # ----------------------------------------------------------------- responses
    async def completion(self, req: CompletionRequest) -> dict[str, Any]:
        run = self.start(await self.prepare_completion(req))
        text, finish = await _collect(run)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.settings.served_model_name,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}],
            "usage": run.usage(),
            "speculative": _spec_stats(run),
        }

    async def chat(self, req: ChatCompletionRequest) -> dict[str, Any]:
        run = self.start(await self.prepare_chat(req))
        text, finish = await _collect(run)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.settings.served_model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "logprobs": None,
                    "finish_reason": finish,
                }
            ],
            "usage": run.usage(),
            "speculative": _spec_stats(run),
        }

    async def stream_completion(self, run: Run) -> AsyncIterator[str]:
        base = {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.settings.served_model_name,
        }

        def choice(text: str, finish: str | None) -> list[dict[str, Any]]:
            return [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}]

        async for event in self._stream(run, base, choice, first=None):
            yield event

    async def stream_chat(self, run: Run) -> AsyncIterator[str]:
        base = {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": self.settings.served_model_name,
        }

        def choice(text: str, finish: str | None) -> list[dict[str, Any]]:
            delta = {"content": text} if text or finish is None else {}
            return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]

        first = [
            {
                "index": 0,
                "delta": {"role": "assistant", "content": ""},
                "logprobs": None,
                "finish_reason": None,
            }
        ]
        async for event in self._stream(run, base, choice, first=first):
            yield event

    async def _stream(
        self,
        run: Run,
        base: dict[str, Any],
        choice: Any,
        first: list[dict[str, Any]] | None,
    ) -> AsyncIterator[str]:
        try:
            if first is not None:
                yield _sse({**base, "choices": first})
            async for delta in run.deltas():
                chunk = {**base, "choices": choice(delta.text, delta.finish_reason)}
                if delta.finish_reason is not None:
                    chunk["usage"] = run.usage()
                yield _sse(chunk)
            if run.prepared.include_usage:
                yield _sse({**base, "choices": [], "usage": run.usage()})
        except Exception as exc:  # headers are sent: report in-band, then end the stream
            self.metrics.errors.labels(self.settings.served_model_name, "server_error").inc()
            code = ExecutorFailedError.code if isinstance(exc, ExecutorError) else "internal_error"
            yield _sse(
                {
                    "error": {
                        "message": f"generation failed: {exc}",
                        "type": "server_error",
                        "param": None,
                        "code": code,
                    }
                }
            )
        yield "data: [DONE]\n\n"


async def _collect(run: Run) -> tuple[str, str | None]:
    parts: list[str] = []
    finish: str | None = None
    try:
        async for delta in run.deltas():
            parts.append(delta.text)
            finish = delta.finish_reason or finish
    except ExecutorError as exc:
        raise ExecutorFailedError(f"generation failed: {exc}") from exc
    return "".join(parts), finish


def _spec_stats(run: Run) -> dict[str, Any]:
    s = run.generation.stats
    return {"steps": s.steps, "draft_tokens": s.drafted, "accepted_draft_tokens": s.accepted}


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"
