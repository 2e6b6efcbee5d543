"""Response bodies and SSE streams of /v1/completions and /v1/chat/completions for a started Run."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from specdeploy_server.api.errors import ExecutorFailedError
from specdeploy_server.api.runs import Prepared, Run, kept_outputs
from specdeploy_server.api.structured import auto_tool_calls, tool_calls_from
from specdeploy_server.core.executors import ExecutorError
from specdeploy_server.core.types import TokenLogprob

if TYPE_CHECKING:
    from specdeploy_server.api.serving import OpenAIServing


@dataclass
class _Collected:
    text: list[str] = field(default_factory=list)
    finish: str | None = None
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


def _base(serving: OpenAIServing, prefix: str, obj: str) -> dict[str, Any]:
    return {
        "id": f"{prefix}-{uuid.uuid4().hex}",
        "object": obj,
        "created": int(time.time()),
        "model": serving.settings.served_model_name,
    }


def _completion_logprobs(
    serving: OpenAIServing, run: Run, items: list[TokenLogprob], tokens: list[int], echo: bool
) -> dict[str, Any] | None:
    prepared = run.prepared
    if prepared.params.logprobs is None:
        return None
    if echo:
        prompt = prepared.prompt_logprobs or [None] * len(prepared.prompt_ids)
        return serving.logprobs.completion([*prompt, *items], [*prepared.prompt_ids, *tokens], 0)
    return serving.logprobs.completion(items, tokens, 0)


async def completion(serving: OpenAIServing, run: Run) -> dict[str, Any]:
    collected = await _collect(run)
    prepared = run.prepared
    choices = []
    for i, item in enumerate(collected):
        text = "".join(item.text)
        logprobs = _completion_logprobs(serving, run, item.logprobs, item.token_ids, prepared.echo)
        if prepared.echo:
            text = prepared.prompt_text + text
        choices.append({"index": i, "text": text, "logprobs": logprobs, "finish_reason": item.finish})
    return {
        **_base(serving, "cmpl", "text_completion"),
        "choices": choices,
        "usage": run.usage(),
        "speculative": run.speculative(),
    }


def _message(text: str, finish: str | None, prepared: Prepared) -> tuple[dict[str, Any], str | None]:
    """The assistant message, with ``tool_calls`` when the text is (forced) or holds (auto) tool calls."""
    if prepared.tool_mode == "forced":
        calls = tool_calls_from(text)
        if calls is not None:
            return {"role": "assistant", "content": None, "tool_calls": calls}, "tool_calls"
    elif prepared.tool_mode == "auto":
        found = auto_tool_calls(text, prepared.tool_names)
        if found is not None:
            content, auto_calls = found
            return {"role": "assistant", "content": content, "tool_calls": auto_calls}, "tool_calls"
    return {"role": "assistant", "content": text}, finish


async def chat(serving: OpenAIServing, run: Run) -> dict[str, Any]:
    collected = await _collect(run)
    prepared = run.prepared
    choices = []
    for i, item in enumerate(collected):
        message, finish = _message("".join(item.text), item.finish, prepared)
        logprobs = serving.logprobs.chat(item.logprobs) if prepared.params.logprobs is not None else None
        choices.append({"index": i, "message": message, "logprobs": logprobs, "finish_reason": finish})
    return {
        **_base(serving, "chatcmpl", "chat.completion"),
        "choices": choices,
        "usage": run.usage(),
        "speculative": run.speculative(),
    }


def stream_completion(serving: OpenAIServing, run: Run) -> AsyncIterator[str]:
    base = _base(serving, "cmpl", "text_completion")
    prepared = run.prepared
    wants_logprobs = prepared.params.logprobs is not None
    first: list[dict[str, Any]] = []
    if prepared.echo:
        logprobs = _completion_logprobs(serving, run, [], [], echo=True)
        first = [
            {"index": i, "text": prepared.prompt_text, "logprobs": logprobs, "finish_reason": None}
            for i in range(prepared.n)
        ]
    offsets = [len(prepared.prompt_text) if prepared.echo else 0] * prepared.n

    def chunk(index: int, text: str, finish: str | None, ids: list[int], items: list[TokenLogprob]) -> Any:
        if not (text or finish or (wants_logprobs and ids)):
            return None
        if not (wants_logprobs or finish):  # the common event, serialised without building it
            offsets[index] += len(text)
            return f'{{"index":{index},"text":{_string(text)},"logprobs":null,"finish_reason":null}}'
        logprobs = serving.logprobs.completion(items, ids, offsets[index]) if wants_logprobs else None
        offsets[index] += len(text)
        return {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}

    plain = None if wants_logprobs else ('{"index":0,"text":', ',"logprobs":null,"finish_reason":null}')
    return _stream(serving, run, base, first, chunk, plain=plain)


def stream_chat(serving: OpenAIServing, run: Run) -> AsyncIterator[str]:
    base = _base(serving, "chatcmpl", "chat.completion.chunk")
    prepared = run.prepared
    wants_logprobs = prepared.params.logprobs is not None
    held = [""] * prepared.n  # with tools: the text so far, sent (as calls or content) once complete
    held_logprobs: list[list[TokenLogprob]] = [[] for _ in range(prepared.n)]  # ... and its logprobs
    first = [
        {"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}
        for i in range(prepared.n)
    ]

    def chunk(index: int, text: str, finish: str | None, ids: list[int], items: list[TokenLogprob]) -> Any:
        if prepared.tool_mode is not None:  # calls are sent whole once the text is complete
            held[index] += text
            if wants_logprobs:
                held_logprobs[index] += items
            if finish is None:
                return None
            logprobs = serving.logprobs.chat(held_logprobs[index]) if wants_logprobs else None
            message, finish = _message(held[index], finish, prepared)
            calls = message.get("tool_calls")
            delta: dict[str, Any] = {"content": message["content"]} if message["content"] else {}
            if calls is not None:
                delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
            return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
        if not (text or finish or (wants_logprobs and ids)):
            return None
        if not (wants_logprobs or finish):  # the common event, serialised without building it
            content = _string(text)
            return f'{{"index":{index},"delta":{{"content":{content}}},"logprobs":null,"finish_reason":null}}'
        logprobs = serving.logprobs.chat(items) if wants_logprobs else None
        delta = {"content": text} if text or finish is None else {}
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish}

    plain = (
        None
        if wants_logprobs or prepared.tool_mode is not None
        else ('{"index":0,"delta":{"content":', '},"logprobs":null,"finish_reason":null}')
    )
    return _stream(serving, run, base, first, chunk, plain=plain)


async def _stream(
    serving: OpenAIServing,
    run: Run,
    base: dict[str, Any],
    first: list[dict[str, Any]],
    chunk: Any,
    *,
    plain: tuple[str, str] | None,
) -> AsyncIterator[str]:
    """The SSE events of a run. ``chunk(index, text, finish, ids, logprobs)`` builds a choice (a dict, a
    preformatted JSON string, or None for no event); ``plain``: the JSON before and after the text of a
    single choice's event that carries only text, when such events need nothing else (no logprobs, no tool
    calls), so that the events of a one-choice request are formatted right here, one string per event."""
    # Every event is the same envelope around one choice: the envelope is serialised once, the choice per
    # event (the bytes are those of json.dumps of the whole event, keys in the same order).
    head = f'data: {_json(base)[:-1]},"choices":['
    # Usage goes out once: in the final `choices: []` chunk when the client asks for it (OpenAI's shape;
    # clients that add up usage across chunks count it once), else with the last finish_reason.
    extra_chunk = run.prepared.include_usage
    try:
        for choice in first:
            yield _sse({**base, "choices": [choice]})
        if len(run.choices) == 1:
            single = run.choices[0]
            step = single.stepper()
            before, after = (head + plain[0], plain[1] + "]}\n\n") if plain is not None else ("", "")
            async with single.opened(run) as outputs:
                async for out in outputs:
                    text, finish, kept = step(out)
                    if finish is None and plain is not None:  # the common event
                        if text:
                            yield f"{before}{_string(text)}{after}"
                        continue
                    ids, logprobs = kept_outputs(out, kept)
                    body = chunk(0, text, finish, ids, logprobs or [])
                    if finish is not None:
                        yield _sse(
                            {**base, "choices": [body]}
                            if extra_chunk
                            else {**base, "choices": [body], "usage": run.usage()}
                        )
                        break
                    if body is not None:
                        yield f"{head}{body if isinstance(body, str) else _json(body)}]}}\n\n"
        else:
            finished = 0
            async for index, delta in run.deltas():
                body = chunk(index, delta.text, delta.finish_reason, delta.token_ids, delta.logprobs or [])
                if body is None:
                    continue
                if delta.finish_reason is not None:
                    finished += 1
                    if finished == len(run.choices) and not extra_chunk:  # the last finish carries usage
                        yield _sse({**base, "choices": [body], "usage": run.usage()})
                        continue
                yield f"{head}{body if isinstance(body, str) else _json(body)}]}}\n\n"
        if extra_chunk:
            yield _sse({**base, "choices": [], "usage": run.usage()})
    except Exception as exc:  # headers are sent: report in-band, then end the stream
        serving.metrics.errors.labels(serving.settings.served_model_name, "server_error").inc()
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


_json = json.JSONEncoder(separators=(",", ":")).encode
#: a str as a JSON string, exactly as ``_json`` writes it (ASCII, escaped)
_string: Callable[[str], str] = json.encoder.encode_basestring_ascii


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {_json(payload)}\n\n"
