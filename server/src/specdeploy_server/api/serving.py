"""The logic behind /v1/completions and /v1/chat/completions, over an EngineClient (no HTTP here)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from specdeploy_server.api import responses, streams
from specdeploy_server.api.context import ResponseContext
from specdeploy_server.api.contract import ChatCompletion, Completion, ModelCard, ModelList
from specdeploy_server.api.errors import BadRequestError, ModelNotFoundError, OverloadedError
from specdeploy_server.api.protocol import ChatCompletionRequest, CompletionRequest
from specdeploy_server.api.runs import Delta, Prepared, Run
from specdeploy_server.api.sampling import choice_seed, required_features, sampling_params
from specdeploy_server.api.structured import requested_guide, structured_output, tool_dicts
from specdeploy_server.core.scheduler import EngineStoppedError, QueueFullError
from specdeploy_server.core.types import FinishReason, RequestSpeculation, SeqStats, StepOutput, TokenLogprob
from specdeploy_server.engine import EngineClient, Generation, ScoresPrompts
from specdeploy_server.grammar import GrammarCompiler, GrammarConstraint, GrammarError
from specdeploy_server.metrics import ServerMetrics
from specdeploy_server.tokenizer import ChatTemplateError

log = logging.getLogger(__name__)

__all__ = ["OFFLOAD_CHARS", "Delta", "OpenAIServing", "Prepared", "Run", "ServingSettings"]
#: text longer than this is tokenised (or its chat template rendered) on the tokenizer threads, not the loop;
#: shorter text costs less than the thread hop (tens of microseconds)
OFFLOAD_CHARS = 2048
TOKENIZER_THREADS = 2
T = TypeVar("T")


@dataclass(frozen=True)
class ServingSettings:
    served_model_name: str
    default_max_tokens: int = 16
    served_model_aliases: tuple[str, ...] = ()
    """Other names a request may send; the answer carries `served_model_name`."""

    @property
    def served_model_names(self) -> tuple[str, ...]:
        return (self.served_model_name, *self.served_model_aliases)

    def check_model(self, model: str) -> None:
        """404 `model_not_found` naming the served names, unless ``model`` is one of them."""
        if model not in self.served_model_names:
            served = ", ".join(f"'{name}'" for name in self.served_model_names)
            raise ModelNotFoundError(
                f"The model '{model}' does not exist; this server serves {served}", param="model"
            )


class OpenAIServing:
    def __init__(self, engine: EngineClient, settings: ServingSettings, metrics: ServerMetrics) -> None:
        self.engine = engine
        self.settings = settings
        self.context = ResponseContext(settings.served_model_name, engine.tokenizer, metrics)
        self._tokenizer_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._compiler, self.structured_output_problem = structured_output(engine)

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

    def list_models(self) -> ModelList:
        """One card per name a request may send, the served model name first (as vLLM lists its names)."""
        return ModelList(object="list", data=[self._model_card(n) for n in self.settings.served_model_names])

    def retrieve_model(self, model: str) -> ModelCard:
        """``GET /v1/models/{model}``: the card of a served name, or 404 ``model_not_found``."""
        self.settings.check_model(model)
        return self._model_card(model)

    def _model_card(self, name: str) -> ModelCard:
        info = self.engine.info
        return ModelCard(
            id=name,
            object="model",
            created=info.created,
            owned_by="specdeploy",
            max_model_len=info.max_model_len,
            structured_output=self.structured_output_problem is None,
        )

    # ----------------------------------------------------------------- validation
    def _check_common(self, req: CompletionRequest | ChatCompletionRequest, grammar: bool) -> None:
        self.settings.check_model(req.model)
        unsupported = req.unsupported()
        if unsupported:
            name = unsupported[0]
            raise BadRequestError(f"'{name}' is not supported by this server", param=name)
        contradiction = req.contradiction()
        if contradiction is not None:
            name, message = contradiction
            raise BadRequestError(message, param=name)
        info = self.engine.info
        for name, feature in required_features(req, grammar):
            if feature not in info.features:
                raise BadRequestError(
                    f"'{name}' is not supported by this server's backend ({info.backend}); "
                    "see docs/server.md",
                    param=name,
                )

    def _budget(
        self,
        prompt_ids: list[int],
        requested: int | None,
        default: int | None,
        param: str,
        prompt: str,
        *,
        echo: bool = False,
    ) -> int:
        """The completion's token budget: ``requested`` (the field ``param``) or ``default`` or what the
        context leaves, after checking the prompt (the field ``prompt``: "prompt" or "messages"). 0 only with
        ``echo`` (the prompt and its logprobs, nothing generated: how evaluation harnesses score a text)."""
        if not prompt_ids:
            raise BadRequestError("the prompt is empty", param=prompt)
        limit = self.engine.info.max_model_len
        vocab = self.engine.info.vocab_size
        scan = vocab is not None and len(prompt_ids) < limit  # a prompt too long is refused below anyway
        if scan and not 0 <= min(prompt_ids) <= max(prompt_ids) < (vocab or 0):
            raise BadRequestError(f"prompt token ids must be in [0, {vocab})", param=prompt)
        room = limit - len(prompt_ids)
        if requested is not None and requested < (0 if echo else 1):
            hint = " (0 only with echo)" if prompt == "prompt" else ""
            raise BadRequestError(f"{param} must be at least 1{hint}, got {requested}", param=param)
        if room < 1:
            raise BadRequestError(
                f"This model's maximum context length is {limit} tokens, but the prompt has "
                f"{len(prompt_ids)} tokens",
                param=prompt,
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

    async def _grammar(self, req: CompletionRequest | ChatCompletionRequest) -> GrammarConstraint | None:
        """The request's grammar compiled against the served tokenizer (400 when it does not compile)."""
        guide = requested_guide(req)
        if guide is None:
            return None
        for name in ("min_tokens", "ignore_eos"):
            if getattr(req, name):
                raise BadRequestError(
                    f"'{name}' cannot be combined with structured output (response_format, tools): "
                    "the grammar decides where the output ends",
                    param=name,
                )
        param = "tool_choice" if isinstance(req, ChatCompletionRequest) and req.calls_tools() else None
        self._check_common(req, grammar=True)
        compiler = self._grammar_compiler(param or "response_format")
        try:
            return await asyncio.to_thread(lambda: compiler.compile(guide.grammar(), guide))
        except GrammarError as exc:
            raise BadRequestError(f"invalid grammar: {exc}", param=param or "response_format") from exc

    def _grammar_compiler(self, param: str) -> GrammarCompiler:
        if self._compiler is None:
            raise BadRequestError(
                f"structured output is not available on this server: {self.structured_output_problem}",
                param=param,
            )
        return self._compiler

    async def prepare_completion(self, req: CompletionRequest) -> Prepared:
        self._check_common(req, grammar=False)
        constraint = await self._grammar(req)
        ids = await self._prompt_ids(req.prompt)
        default = self.settings.default_max_tokens
        max_tokens = self._budget(ids, req.max_tokens, default, "max_tokens", "prompt", echo=req.echo)
        _check_min_tokens(req, max_tokens)
        params = sampling_params(req, self.engine.info.vocab_size)
        prompt_logprobs: list[TokenLogprob | None] | None = None
        prompt_text = ""
        if req.echo:
            prompt_text = req.prompt if isinstance(req.prompt, str) else self.engine.tokenizer.decode(ids)
            if params.logprobs is not None:
                assert isinstance(self.engine, ScoresPrompts)  # the PROMPT_LOGPROBS feature says so
                prompt_logprobs = [None, *await self.engine.prompt_logprobs(ids, params.logprobs)]
        speculation = await self._speculation(req)
        return Prepared(
            ids,
            max_tokens,
            params,
            req.stop_strings(),
            self._include_usage(req),
            continuous_usage=self._continuous_usage(req),
            n=req.n,
            constraint=constraint,
            speculation=speculation,
            predicted=req.prediction is not None,
            echo=req.echo,
            prompt_logprobs=prompt_logprobs,
            prompt_text=prompt_text,
            skip_special_tokens=req.skip_special_tokens,
            include_stop_str=req.include_stop_str_in_output,
        )

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
        self._check_common(req, grammar=False)
        constraint = await self._grammar(req)
        messages = [m.for_template() for m in req.messages]
        # Only the content is surely rendered (a template may leave other fields out): a lower bound.
        chars = sum(len(m["content"]) for m in messages)
        self._precheck(chars, "messages")  # the rendered text holds every message's content, and more
        tokenizer = self.engine.tokenizer
        tool_mode = req.tool_mode()
        if tool_mode == "auto" and not tokenizer.supports_tools:
            raise BadRequestError(
                "tool_choice 'auto' (the default when tools are sent) needs a chat template that renders the "
                "tools, and this model's does not; use tool_choice 'required' or a named function",
                param="tool_choice",
            )
        tools = tool_dicts(req) if tool_mode is not None else None
        try:
            text = await self._off_loop(chars, tokenizer.render_chat, messages, tools)
        except ChatTemplateError as exc:
            raise BadRequestError(str(exc), param="messages") from exc
        ids = await self._off_loop(len(text), tokenizer.encode, text, False)
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        max_tokens = self._budget(ids, requested, None, param, "messages")
        _check_min_tokens(req, max_tokens)
        speculation = await self._speculation(req)
        return Prepared(
            ids,
            max_tokens,
            sampling_params(req, self.engine.info.vocab_size),
            req.stop_strings(),
            self._include_usage(req),
            continuous_usage=self._continuous_usage(req),
            n=req.n,
            constraint=constraint,
            speculation=speculation,
            predicted=req.prediction is not None,
            tool_mode=tool_mode,
            tool_names=frozenset(t.function.name for t in req.tools or []),
            skip_special_tokens=req.skip_special_tokens,
            include_stop_str=req.include_stop_str_in_output,
        )

    async def _speculation(self, req: CompletionRequest | ChatCompletionRequest) -> RequestSpeculation:
        """The request's prediction, tokenised once with the target's tokenizer (no special tokens), and its
        draft-length cap. A prediction counts toward the request's limits: the body size (it is part of the
        body) and the context: one longer than ``max_model_len`` tokens is refused."""
        cap = req.speculation.cap() if req.speculation is not None else None
        if req.prediction is None:
            return RequestSpeculation((), cap)
        text = req.prediction.text()
        limit = self.engine.info.max_model_len
        per_token = self.engine.tokenizer.max_chars_per_token
        if per_token is not None and len(text) > limit * per_token:
            raise BadRequestError(
                f"the prediction has {len(text)} characters, so at least {-(-len(text) // per_token)} "
                f"tokens, more than this model's maximum context length of {limit} tokens",
                param="prediction",
                code="context_length_exceeded",
            )
        ids = await self._off_loop(len(text), self.engine.tokenizer.encode, text, False) if text else []
        if len(ids) > limit:
            raise BadRequestError(
                f"the prediction has {len(ids)} tokens, more than this model's maximum context length of "
                f"{limit} tokens",
                param="prediction",
                code="context_length_exceeded",
            )
        return RequestSpeculation(tuple(ids), cap)

    @staticmethod
    def _include_usage(req: CompletionRequest | ChatCompletionRequest) -> bool:
        return bool(req.stream_options and req.stream_options.include_usage)

    @staticmethod
    def _continuous_usage(req: CompletionRequest | ChatCompletionRequest) -> bool:
        options = req.stream_options
        return bool(options and options.include_usage and options.continuous_usage_stats)

    def start(self, prepared: Prepared) -> Run:
        """Queue the request's ``n`` generations (each its own sequence, speculative state and grammar
        state; choice i > 0 samples with a seed derived from the request's)."""
        if prepared.max_tokens == 0:  # echo only: nothing to generate, nothing queued
            return Run(prepared, [_nothing_generated() for _ in range(prepared.n)], self.context)
        generations: list[Generation] = []
        try:
            for i in range(prepared.n):
                params = (  # choice 0 keeps the request's own seed
                    prepared.params
                    if i == 0
                    else dataclasses.replace(prepared.params, seed=choice_seed(prepared.params.seed, i))
                )
                constraint = prepared.constraint.copy() if prepared.constraint is not None else None
                generations.append(
                    self.engine.generate(
                        prepared.prompt_ids,
                        prepared.max_tokens,
                        params,
                        constraint,
                        speculation=prepared.speculation,
                    )
                )
        except (QueueFullError, EngineStoppedError) as exc:
            for generation in generations:
                if generation.cancel is not None:
                    generation.cancel()
            if isinstance(exc, QueueFullError):
                raise OverloadedError(str(exc)) from exc
            raise OverloadedError(str(exc), code="shutting_down") from exc
        return Run(prepared, generations, self.context)

    # ----------------------------------------------------------------- responses
    async def completion(self, req: CompletionRequest) -> Completion:
        return await responses.completion(self.context, self.start(await self.prepare_completion(req)))

    async def chat(self, req: ChatCompletionRequest) -> ChatCompletion:
        return await responses.chat(self.context, self.start(await self.prepare_chat(req)))

    def stream_completion(self, run: Run) -> AsyncIterator[str]:
        return streams.stream_completion(self.context, run)

    def stream_chat(self, run: Run) -> AsyncIterator[str]:
        return streams.stream_chat(self.context, run)


def _check_min_tokens(req: CompletionRequest | ChatCompletionRequest, max_tokens: int) -> None:
    if req.min_tokens > max_tokens:
        raise BadRequestError(
            f"min_tokens ({req.min_tokens}) must be at most the completion's token budget ({max_tokens})",
            param="min_tokens",
        )


def _nothing_generated() -> Generation:
    """A generation of 0 tokens (``max_tokens: 0`` with ``echo``): it ends at once, for its length."""

    async def outputs() -> AsyncGenerator[StepOutput, None]:
        yield StepOutput([], FinishReason.LENGTH, 0, 0)

    return Generation(outputs(), SeqStats())
