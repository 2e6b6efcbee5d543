"""The server-sent events of streamed /v1/completions and /v1/chat/completions for a started Run.

Every event is a chunk of the contract (``CompletionChunk``, ``ChatCompletionChunk``) serialised as
``json.dumps`` would (ASCII, compact). Most events carry a few characters of one choice's text and nothing
else, and they are formatted without building a model each: the chunk's envelope (``id`` ... up to the
choices) and the text-only choice are serialised once, from the same models, and cut around the text
(:class:`ChunkFormat`, :func:`text_parts`); every other event (logprobs, tool calls, a finish reason, usage)
is built as its model. The bytes are the same either way (tests/server/test_stream_events.py).
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from pydantic import BaseModel

from specdeploy_server.api.autocall import AutoCallStream
from specdeploy_server.api.context import ResponseContext
from specdeploy_server.api.contract import (
    ChatCompletionChunk,
    ChatLogprobs,
    ChunkChoice,
    ChunkDelta,
    CompletionChoice,
    CompletionChunk,
    FinishReasonName,
    ToolCallDelta,
    Usage,
    body,
)
from specdeploy_server.api.errors import ExecutorFailedError, InternalServerError
from specdeploy_server.api.forcedcall import ForcedCallStream, per_chunk
from specdeploy_server.api.responses import Envelope, assistant_message, completion_logprobs
from specdeploy_server.api.runs import Run, kept_outputs
from specdeploy_server.core.executors import ExecutorError
from specdeploy_server.core.types import TokenLogprob

_json = json.JSONEncoder(separators=(",", ":")).encode
#: a str as a JSON string, exactly as ``_json`` writes it (ASCII, escaped)
_string: Callable[[str], str] = json.encoder.encode_basestring_ascii
#: stands for the text while a text-only choice is serialised to be cut around it (no text escapes to it)
_MARK = "\x00text\x00"

#: a choice, or a text-only choice already serialised (:func:`text_parts`), or None for no event; or the
#: choices of several events in a row (a tool call's opening, then its first fragment)
Choice = BaseModel | str | list[BaseModel] | None
#: ``chunk(index, text, finish_reason, token_ids, logprobs)``: the choice one output of a choice makes
ChunkBuilder = Callable[[int, str, FinishReasonName | None, list[int], list[TokenLogprob]], Choice]


def sse(payload: BaseModel) -> str:
    return f"data: {_json(body(payload))}\n\n"


def completion_text_choice(index: int, text: str) -> CompletionChoice:
    return CompletionChoice(index=index, text=text, logprobs=None, finish_reason=None)


def chat_text_choice(index: int, text: str) -> ChunkChoice:
    return ChunkChoice(index=index, delta=ChunkDelta(content=text), logprobs=None, finish_reason=None)


@functools.cache
def text_parts(choice: Callable[[int, str], BaseModel], index: int) -> tuple[str, str]:
    """The serialisation of ``choice(index, text)`` cut around its text: that choice is ``before`` + the
    text as a JSON string + ``after``, whatever the text."""
    whole = _json(body(choice(index, _MARK)))
    before, mark, after = whole.partition(_string(_MARK))
    if not mark or _string(_MARK) in after:
        raise ValueError(f"{choice.__name__} does not hold its text once")
    return before, after


class ChunkFormat:
    """The chunks of one stream: ``chunk(envelope fields, choices=..., usage=...)`` builds one; ``head`` and
    ``tail`` are its serialisation before and after the choices, the same for every chunk of the stream."""

    def __init__(self, chunk: Callable[..., BaseModel], envelope: Envelope, object_: str) -> None:
        self._chunk = chunk
        self._fields = {
            "id": envelope.id,
            "object": object_,
            "created": envelope.created,
            "model": envelope.model,
        }
        before, mark, after = sse(chunk(**self._fields, choices=[])).rpartition('"choices":[]')
        if not mark:
            raise ValueError(f"{getattr(chunk, '__name__', chunk)} does not end with its choices")
        self.head = f'{before}"choices":['
        self.tail = f"]{after}"

    def event(self, choices: list[BaseModel], usage: Usage | None = None) -> str:
        """A chunk built as its model (``usage`` left out when None)."""
        extra = {} if usage is None else {"usage": usage}
        return sse(self._chunk(**self._fields, choices=choices, **extra))

    def choice_event(self, choice: BaseModel | str, usage: Usage | None = None) -> str:
        """A chunk of one choice and nothing else (but ``usage``, when given)."""
        serialised = choice if isinstance(choice, str) else _json(body(choice))
        if usage is None:
            return f"{self.head}{serialised}{self.tail}"
        return f'{self.head}{serialised}],"usage":{_json(body(usage))}{self.tail[1:]}'


def stream_completion(context: ResponseContext, run: Run) -> AsyncIterator[str]:
    chunks = ChunkFormat(CompletionChunk, Envelope.new(context, "cmpl"), "text_completion")
    prepared = run.prepared
    wants_logprobs = prepared.params.logprobs is not None
    first: list[BaseModel] = []
    if prepared.echo:
        logprobs = completion_logprobs(context, run, [], [], echo=True)
        first = [
            CompletionChoice(index=i, text=prepared.prompt_text, logprobs=logprobs, finish_reason=None)
            for i in range(prepared.n)
        ]
    offsets = [len(prepared.prompt_text) if prepared.echo else 0] * prepared.n

    def chunk(
        index: int, text: str, finish: FinishReasonName | None, ids: list[int], items: list[TokenLogprob]
    ) -> Choice:
        if not (text or finish or (wants_logprobs and ids)):
            return None
        if not (wants_logprobs or finish):  # the common event, serialised without building it
            offsets[index] += len(text)
            before, after = text_parts(completion_text_choice, index)
            return f"{before}{_string(text)}{after}"
        logprobs = context.logprobs.completion(items, ids, offsets[index]) if wants_logprobs else None
        offsets[index] += len(text)
        return CompletionChoice(index=index, text=text, logprobs=logprobs, finish_reason=finish)

    text_only = None if wants_logprobs or prepared.continuous_usage else completion_text_choice
    return _stream(context, run, chunks, first, chunk, text_only=text_only)


def stream_chat(context: ResponseContext, run: Run) -> AsyncIterator[str]:
    chunks = ChunkFormat(ChatCompletionChunk, Envelope.new(context, "chatcmpl"), "chat.completion.chunk")
    prepared = run.prepared
    wants_logprobs = prepared.params.logprobs is not None
    # with tools: the logprobs of text not sent yet (held while it may be part of a call)
    held_logprobs: list[list[TokenLogprob]] = [[] for _ in range(prepared.n)]
    first: list[BaseModel] = [
        ChunkChoice(
            index=i, delta=ChunkDelta(role="assistant", content=""), logprobs=None, finish_reason=None
        )
        for i in range(prepared.n)
    ]

    mode, names = prepared.tool_mode, prepared.tool_names
    calls = [ForcedCallStream(names) for _ in range(prepared.n)] if mode == "forced" else None
    autos = [AutoCallStream(names) for _ in range(prepared.n)] if mode == "auto" else None

    def forced(index: int, text: str, finish: FinishReasonName | None, items: list[TokenLogprob]) -> Choice:
        """A forced call's arguments go out as they are generated (its logprobs with them)."""
        assert calls is not None
        stream = calls[index]
        deltas = stream.feed(text, finished=finish is not None)
        if wants_logprobs:
            held_logprobs[index] += items
        parts: dict[str, Any] = {}
        if finish is not None and stream.call is None:  # not a call after all (cut before its name)
            message, finish = assistant_message(stream.text, finish, prepared)
            if message.content:
                parts["content"] = message.content
        elif finish is not None:
            finish = "tool_calls" if stream.call is not None and stream.call.complete else finish
        elif not deltas:
            return None
        logprobs = context.logprobs.chat(held_logprobs[index]) if wants_logprobs else None
        held_logprobs[index] = []
        return _call_choices(index, parts, deltas, logprobs, finish)

    def chunk(
        index: int, text: str, finish: FinishReasonName | None, ids: list[int], items: list[TokenLogprob]
    ) -> Choice:
        if calls is not None:
            return forced(index, text, finish, items)
        if autos is not None:
            held = held_logprobs[index] if wants_logprobs else None
            return _auto_choice(context, autos[index], held, (index, text, finish, items))
        if not (text or finish or (wants_logprobs and ids)):
            return None
        if not (wants_logprobs or finish):  # the common event, serialised without building it
            before, after = text_parts(chat_text_choice, index)
            return f"{before}{_string(text)}{after}"
        logprobs = context.logprobs.chat(items) if wants_logprobs else None
        content = ChunkDelta(content=text) if text or finish is None else ChunkDelta()
        return ChunkChoice(index=index, delta=content, logprobs=logprobs, finish_reason=finish)

    plain = not (wants_logprobs or prepared.tool_mode is not None or prepared.continuous_usage)
    text_only = chat_text_choice if plain else None
    return _stream(context, run, chunks, first, chunk, text_only=text_only)


def _auto_choice(
    context: ResponseContext,
    stream: AutoCallStream,
    held: list[TokenLogprob] | None,
    output: tuple[int, str, FinishReasonName | None, list[TokenLogprob]],
) -> Choice:
    """The model's own calls (``tool_choice: auto``): content as it comes, each call's arguments as they are
    generated. ``held``: the logprobs of text not sent yet, sent with the next event (None: none wanted);
    ``output``: the choice's index, its new text, its finish reason and the new text's logprobs."""
    index, text, finish, items = output
    found = stream.feed(text, finished=finish is not None)
    if held is not None:
        held += items
    if finish is None and not (found.content or found.calls):
        return None
    if finish is not None and stream.calls and stream.complete_calls == stream.calls:
        finish = "tool_calls"
    parts: dict[str, Any] = {"content": found.content} if found.content else {}
    logprobs = None
    if held is not None:
        logprobs = context.logprobs.chat(list(held))
        held.clear()
    return _call_choices(index, parts, found.calls, logprobs, finish)


def _call_choices(
    index: int,
    parts: dict[str, Any],
    calls: list[ToolCallDelta],
    logprobs: ChatLogprobs | None,
    finish: FinishReasonName | None,
) -> BaseModel | list[BaseModel]:
    """A choice's event(s) of tool-call deltas: ``parts`` (content) and the logprobs with the first, the
    finish reason with the last; one event per call's delta (:func:`per_chunk`)."""
    groups = per_chunk(calls) or [[]]
    choices: list[BaseModel] = []
    for i, group in enumerate(groups):
        delta = dict(parts) if i == 0 else {}
        if group:
            delta["tool_calls"] = group
        last = i == len(groups) - 1
        choices.append(
            ChunkChoice(
                index=index,
                delta=ChunkDelta(**delta),
                logprobs=logprobs if i == 0 else None,
                finish_reason=finish if last else None,
            )
        )
    return choices[0] if len(choices) == 1 else choices


def _events(choice: Choice) -> tuple[list[BaseModel], BaseModel | str | None]:
    """The choices of the events ``choice`` makes: those before the last, and the last (None: no event)."""
    if isinstance(choice, list):
        return choice[:-1], choice[-1]
    return [], choice


async def _stream(
    context: ResponseContext,
    run: Run,
    chunks: ChunkFormat,
    first: list[BaseModel],
    chunk: ChunkBuilder,
    *,
    text_only: Callable[[int, str], BaseModel] | None,
) -> AsyncIterator[str]:
    """The SSE events of a run: ``first`` (a chunk per choice), then a chunk per output that ``chunk``
    makes one of. ``text_only``: the choice of an event that carries only text, when such events need
    nothing else (no logprobs, no tool calls), so that the events of a one-choice request are formatted
    right here, one string per event."""
    # Usage goes out once: in the final `choices: []` chunk when the client asks for it (OpenAI's shape;
    # clients that add up usage across chunks count it once), else with the last finish_reason; with
    # `continuous_usage_stats`, also the usage so far in every chunk (vLLM's shape).
    extra_chunk = run.prepared.include_usage
    continuous = run.prepared.continuous_usage  # (its callers give no `text_only` then)

    def choice_event(choice: BaseModel | str) -> str:
        return chunks.choice_event(choice, run.usage() if continuous else None)

    try:
        for choice in first:
            yield chunks.event([choice], run.usage() if continuous else None)
        if len(run.choices) == 1:
            single = run.choices[0]
            step = single.stepper()
            before = after = ""
            if text_only is not None:
                text_before, text_after = text_parts(text_only, 0)
                before, after = chunks.head + text_before, text_after + chunks.tail
            async with single.opened(run) as outputs:
                async for out in outputs:
                    text, finish, kept = step(out)
                    if finish is None and text_only is not None:  # the common event
                        if text:
                            yield f"{before}{_string(text)}{after}"
                        continue
                    ids, logprobs = kept_outputs(out, kept)
                    leading, body_ = _events(chunk(0, text, finish, ids, logprobs or []))
                    for leading_choice in leading:
                        yield choice_event(leading_choice)
                    if finish is not None:
                        assert isinstance(body_, BaseModel)  # a finish is never a text-only event
                        yield chunks.event([body_], run.usage() if continuous or not extra_chunk else None)
                        break
                    if body_ is not None:
                        yield choice_event(body_)
        else:
            finished = 0
            async for index, delta in run.deltas():
                built = chunk(index, delta.text, delta.finish_reason, delta.token_ids, delta.logprobs or [])
                leading, body_ = _events(built)
                for leading_choice in leading:
                    yield choice_event(leading_choice)
                if body_ is None:
                    continue
                if delta.finish_reason is not None:
                    finished += 1
                    if finished == len(run.choices) and not extra_chunk:  # the last finish carries usage
                        assert isinstance(body_, BaseModel)
                        yield chunks.event([body_], run.usage())
                        continue
                yield choice_event(body_)
        if extra_chunk:
            yield chunks.event([], run.usage())
    except Exception as exc:  # headers are sent: report in-band, then end the stream
        context.count_stream_failure()
        message = f"generation failed: {exc}"
        error = (
            ExecutorFailedError(message) if isinstance(exc, ExecutorError) else InternalServerError(message)
        )
        yield f"data: {_json(error.body())}\n\n"
    yield "data: [DONE]\n\n"
