"""A Responses request as the chat completion request the serving path generates from: pure functions.

``input`` (a string, or items: messages, ``function_call`` and ``function_call_output``) and the history of
``previous_response_id`` become chat ``messages``; ``instructions`` a system message first; function tools
the chat ``tools``; ``text.format`` the ``response_format``; ``max_output_tokens`` ``max_completion_tokens``.
Anything that has no chat counterpart is refused with a 400 naming the item and field.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from specdeploy_server.api.errors import BadRequestError
from specdeploy_server.api.protocol import ChatCompletionRequest
from specdeploy_server.api.responses_api.protocol import (
    FormatJSONObject,
    FormatJSONSchema,
    FunctionTool,
    FunctionToolChoice,
    ResponsesRequest,
)

MESSAGE_ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")


def _bad(message: str, param: str = "input") -> BadRequestError:
    return BadRequestError(message, param=param)


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """``input`` as a list of items (a string is one user message), each checked (:func:`chat_messages`
    reads them)."""
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}]
    items = [dict(item) for item in req.input]
    chat_messages(items)  # refuses what it cannot read, naming it
    return items


def _part_text(part: object) -> str | None:
    if not isinstance(part, dict):
        return None
    kind = part.get("type")
    key = "text" if kind in TEXT_PARTS else "refusal" if kind == "refusal" else None
    value = part.get(key) if key is not None else None
    return value if isinstance(value, str) else None


def _text(content: object, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _bad(f"{where} must be a string or a list of content parts")
    texts = []
    for j, part in enumerate(content):
        text = _part_text(part)
        if text is None:
            kind = part.get("type") if isinstance(part, dict) else None
            raise _bad(
                f"{where}[{j}]: content part type {kind!r} is not supported; this server reads text parts "
                "(input_text, output_text) only"
            )
        texts.append(text)
    return "".join(texts)


def _string(item: dict[str, Any], key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str):
        raise _bad(f"{where}.{key} must be a string")
    return value


def chat_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as chat messages: a message keeps its role and its text; consecutive ``function_call``
    items become one assistant message's ``tool_calls`` (joining the assistant text just before them, as a
    chat model produced them); a ``function_call_output`` becomes a ``tool`` message answering its call."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an object")
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            role = item.get("role")
            if role not in MESSAGE_ROLES:
                raise _bad(f"{where}.role must be one of {', '.join(MESSAGE_ROLES)}, got {role!r}")
            messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call = {
                "id": _string(item, "call_id", where),
                "type": "function",
                "function": {
                    "name": _string(item, "name", where),
                    "arguments": _string(item, "arguments", where),
                },
            }
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if not last["content"]:
                    last["content"] = None
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "tool_call_id": _string(item, "call_id", where),
                    "content": _text(output, f"{where}.output"),
                }
            )
        elif kind == "item_reference":
            raise _bad(f"{where}: item references are not supported; send the item itself")
        elif kind == "reasoning":
            raise _bad(f"{where}: reasoning items are not supported (the served model produces none)")
        else:
            raise _bad(
                f"{where}.type {kind!r} is not supported; use message, function_call or function_call_output"
            )
    return messages


def function_tools(req: ResponsesRequest) -> list[FunctionTool]:
    """The request's tools, each a function tool (built-in tools such as web_search are refused)."""
    tools = []
    for i, tool in enumerate(req.tools or []):
        kind = tool.get("type")
        if kind != "function":
            raise _bad(
                f"tools[{i}].type {kind!r} is not supported: only function tools (built-in tools such as "
                "web_search, file_search or mcp do not run on this server)",
                "tools",
            )
        try:
            tools.append(FunctionTool.model_validate(tool))
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first.get("loc", ()))
            raise _bad(f"tools[{i}].{field}: {first.get('msg', 'invalid value')}", "tools") from exc
    return tools


def _chat_tool(tool: FunctionTool) -> dict[str, Any]:
    function = tool.model_dump(exclude={"type"}, exclude_none=True)
    return {"type": "function", "function": function}


def _chat_tool_choice(req: ResponsesRequest) -> str | dict[str, Any] | None:
    choice = req.tool_choice
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, FunctionToolChoice):
        return {"type": "function", "function": {"name": choice.name}}
    if choice.get("type") == "function":
        raise _bad('tool_choice {"type": "function"} needs the function\'s name (a string)', "tool_choice")
    raise _bad(
        f"tool_choice type {choice.get('type')!r} is not supported; use none, auto, required or "
        '{"type": "function", "name": ...}',
        "tool_choice",
    )


def _response_format(req: ResponsesRequest) -> dict[str, Any] | None:
    fmt = req.text_format()
    if isinstance(fmt, FormatJSONObject):
        return {"type": "json_object"}
    if isinstance(fmt, FormatJSONSchema):
        spec: dict[str, Any] = {"name": fmt.name, "schema": fmt.schema_}
        if fmt.strict is not None:
            spec["strict"] = fmt.strict
        return {"type": "json_schema", "json_schema": spec}
    return None


#: the chat fields these Responses fields are passed on as, unchanged
_SAME_FIELDS = ("temperature", "top_p", "user", "top_k", "min_p", "repetition_penalty", "seed")


def chat_request(req: ResponsesRequest, history: list[dict[str, Any]]) -> ChatCompletionRequest:
    """The chat completion request that generates ``req``'s output, after ``history`` (the items of the
    previous responses: their inputs and outputs; ``instructions`` are never carried over, as OpenAI)."""
    messages = chat_messages([*history, *input_items(req)])
    if req.instructions is not None:
        messages.insert(0, {"role": "system", "content": req.instructions})
    if not messages:
        raise _bad("input holds no items")
    body: dict[str, Any] = {"model": req.model, "messages": messages}
    for name in _SAME_FIELDS:
        value = getattr(req, name)
        if value is not None:
            body[name] = value
    if req.max_output_tokens is not None:
        body["max_completion_tokens"] = req.max_output_tokens
    tools = function_tools(req)
    if tools:
        body["tools"] = [_chat_tool(t) for t in tools]
    choice = _chat_tool_choice(req)
    if choice is not None:
        body["tool_choice"] = choice
    fmt = _response_format(req)
    forced_call = bool(tools) and choice not in (None, "auto", "none")
    if fmt is not None and not forced_call:  # a forced call's output is the call: no text to format
        body["response_format"] = fmt
    if req.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    try:
        return ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:  # a message the chat path cannot take
        first = exc.errors()[0]
        raise _bad(f"input: {first.get('msg', 'invalid value')}") from exc


#: chat parameter names in errors of the serving path -> the Responses field they came from
CHAT_TO_RESPONSES_PARAM = {
    "max_completion_tokens": "max_output_tokens",
    "max_tokens": "max_output_tokens",
    "messages": "input",
    "response_format": "text.format",
    "prompt": "input",
}


def responses_error(exc: BadRequestError) -> BadRequestError:
    """An error of the chat serving path, naming the Responses field the client sent instead."""
    param = CHAT_TO_RESPONSES_PARAM.get(exc.param or "", exc.param)
    message = exc.message
    for chat_name, name in CHAT_TO_RESPONSES_PARAM.items():
        if chat_name != "prompt":
            message = message.replace(chat_name, name)
    error = BadRequestError(message, param=param, code=exc.code)
    error.status, error.type = exc.status, exc.type
    return error
