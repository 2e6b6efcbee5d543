"""The whole (non-streamed) response bodies of /v1/completions and /v1/chat/completions for a started Run."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from specdeploy_server.api.context import ResponseContext
from specdeploy_server.api.contract import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    Completion,
    CompletionChoice,
    CompletionLogprobs,
    FinishReasonName,
    ToolCall,
)
from specdeploy_server.api.errors import ExecutorFailedError
from specdeploy_server.api.forcedcall import cut_call, forced_tool_call, parse_forced_call
from specdeploy_server.api.runs import Prepared, Run
from specdeploy_server.api.structured import auto_tool_calls, tool_calls_from
from specdeploy_server.core.executors import ExecutorError
from specdeploy_server.core.types import TokenLogprob


@dataclass(frozen=True)
class Envelope:
    """The fields every body (and every chunk of a stream) of one response shares."""

    id: str
    created: int
    model: str

    @classmethod
    def new(cls, context: ResponseContext, prefix: str) -> Envelope:
        return cls(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), context.model)


@dataclass
class _Collected:
    text: list[str] = field(default_factory=list)
    finish: FinishReasonName | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)


async def _collect(run: Run) -> list[_Collected]:
    out = [_Collected() for _ in run.choices]
    try:
        async for index, delta in run.deltas():
            item = out[index]
            item.text.append(delta.text)
            item.finish = delta.finish_reason or item.finish
            item.token_ids += delta.token_ids
            item.logprobs += delta.logprobs or []
    except ExecutorError as exc:
        raise ExecutorFailedError(f"generation failed: {exc}") from exc
    return out


def completion_logprobs(
    context: ResponseContext, run: Run, items: list[TokenLogprob], tokens: list[int], echo: bool
) -> CompletionLogprobs | None:
    """A completion choice's logprobs (None when not asked for); with ``echo``, the prompt's come first."""
    prepared = run.prepared
    if prepared.params.logprobs is None:
        return None
    if echo:
        prompt = prepared.prompt_logprobs or [None] * len(prepared.prompt_ids)
        return context.logprobs.completion([*prompt, *items], [*prepared.prompt_ids, *tokens], 0)
    return context.logprobs.completion(items, tokens, 0)


async def completion(context: ResponseContext, run: Run) -> Completion:
    collected = await _collect(run)
    prepared = run.prepared
    choices = []
    for i, item in enumerate(collected):
        text = "".join(item.text)
        logprobs = completion_logprobs(context, run, item.logprobs, item.token_ids, prepared.echo)
        if prepared.echo:
            text = prepared.prompt_text + text
        choices.append(CompletionChoice(index=i, text=text, logprobs=logprobs, finish_reason=item.finish))
    envelope = Envelope.new(context, "cmpl")
    return Completion(
        id=envelope.id,
        object="text_completion",
        created=envelope.created,
        model=envelope.model,
        choices=choices,
        usage=run.usage(),
        speculative=run.speculative(),
    )


def _tool_calls(calls: Sequence[dict[str, Any]]) -> list[ToolCall]:
    return [ToolCall.model_validate(call) for call in calls]


def assistant_message(
    text: str, finish: FinishReasonName | None, prepared: Prepared
) -> tuple[AssistantMessage, FinishReasonName | None]:
    """The assistant message, with ``tool_calls`` when the text is (forced) or holds (auto) tool calls."""
    if prepared.tool_mode == "forced":
        call = parse_forced_call(text) or cut_call(text, prepared.tool_names)
        if call is not None:  # a call (complete, or cut by max_tokens: finish_reason length)
            message = AssistantMessage(role="assistant", content=None, tool_calls=[forced_tool_call(call)])
            return message, "tool_calls" if call.complete else finish
        calls = tool_calls_from(text)
        if calls is not None:
            return AssistantMessage(
                role="assistant", content=None, tool_calls=_tool_calls(calls)
            ), "tool_calls"
    elif prepared.tool_mode == "auto":
        found = auto_tool_calls(text, prepared.tool_names)
        if found is not None:
            content, auto_calls = found
            message = AssistantMessage(role="assistant", content=content, tool_calls=_tool_calls(auto_calls))
            return message, "tool_calls"
    return AssistantMessage(role="assistant", content=text), finish


async def chat(context: ResponseContext, run: Run) -> ChatCompletion:
    collected = await _collect(run)
    prepared = run.prepared
    choices = []
    for i, item in enumerate(collected):
        message, finish = assistant_message("".join(item.text), item.finish, prepared)
        logprobs = context.logprobs.chat(item.logprobs) if prepared.params.logprobs is not None else None
        choices.append(ChatChoice(index=i, message=message, logprobs=logprobs, finish_reason=finish))
    envelope = Envelope.new(context, "chatcmpl")
    return ChatCompletion(
        id=envelope.id,
        object="chat.completion",
        created=envelope.created,
        model=envelope.model,
        choices=choices,
        usage=run.usage(),
        speculative=run.speculative(),
    )
