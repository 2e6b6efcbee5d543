"""``response_format`` and ``tools`` -> a grammar (llguidance), and generated tool calls -> the OpenAI shape.

Accepted ``response_format`` types (as llgtrt): ``text``; ``json_object`` (any JSON object);
``json_schema`` (``{"json_schema": {"name": ..., "schema": {...}}}``); ``lark_grammar``
(``{"lark_grammar": "<Lark source>"}``, llguidance's Lark dialect); ``llguidance`` (``{"grammar": {...}}``,
a top-level llguidance grammar). ``tool_choice: "required"`` or a named function constrains the output to
``{"name": <a tool's name>, "arguments": <that tool's parameters>}``.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

from specdeploy_server.api.errors import BadRequestError
from specdeploy_server.api.protocol import ChatCompletionRequest, CompletionRequest, Tool
from specdeploy_server.grammar import GrammarCompiler

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema", "lark_grammar", "llguidance")
_ANY_OBJECT: dict[str, Any] = {"type": "object"}


def requested_grammar(req: CompletionRequest | ChatCompletionRequest) -> str | None:
    """The llguidance grammar the request's output must follow, or None (raises BadRequestError)."""
    tools = isinstance(req, ChatCompletionRequest) and req.calls_tools()
    fmt = req.response_format or {}
    kind = fmt.get("type", "text")
    if tools:
        if kind != "text":
            raise BadRequestError(
                "response_format cannot be combined with tools and tool_choice", param="response_format"
            )
        assert isinstance(req, ChatCompletionRequest)
        return GrammarCompiler.from_json_schema(tool_call_schema(req))
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarCompiler.from_json_schema(_ANY_OBJECT)
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequestError(
                "response_format json_schema needs json_schema.schema (an object)", param="response_format"
            )
        return GrammarCompiler.from_json_schema(schema)
    if kind == "lark_grammar":
        lark = fmt.get("lark_grammar")
        if not isinstance(lark, str) or not lark.strip():
            raise BadRequestError(
                "response_format lark_grammar needs lark_grammar (Lark source)", param="response_format"
            )
        return GrammarCompiler.from_lark(lark)
    if kind == "llguidance":
        grammar = fmt.get("grammar")
        if not isinstance(grammar, dict):
            raise BadRequestError(
                "response_format llguidance needs grammar (an object)", param="response_format"
            )
        return json.dumps(grammar)
    raise BadRequestError(
        f"response_format type '{kind}' is not supported; use one of {', '.join(RESPONSE_FORMAT_TYPES)}",
        param="response_format",
    )


def _call_schema(tool: Tool) -> dict[str, Any]:
    parameters = tool.function.parameters or {"type": "object", "properties": {}}
    return {
        "type": "object",
        "properties": {"name": {"const": tool.function.name}, "arguments": parameters},
        "required": ["name", "arguments"],
        "additionalProperties": False,
    }


def tool_call_schema(req: ChatCompletionRequest) -> dict[str, Any]:
    """The JSON schema of one call of the allowed tool(s): the named one, or any of them (``required``)."""
    tools = req.tools or []
    choice = req.tool_choice
    if choice is not None and not isinstance(choice, str):
        named = [t for t in tools if t.function.name == choice.function.name]
        if not named:
            raise BadRequestError(
                f"tool_choice names '{choice.function.name}', which is not in tools", param="tool_choice"
            )
        return _call_schema(named[0])
    if len(tools) == 1:
        return _call_schema(tools[0])
    return {"anyOf": [_call_schema(t) for t in tools]}


def tool_calls_from(text: str) -> list[dict[str, Any]] | None:
    """The generated call as OpenAI ``tool_calls``; None when the text is not a complete call (the output
    was cut by max_tokens)."""
    try:
        call = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
        return None
    return [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": call["name"], "arguments": json.dumps(call["arguments"])},
        }
    ]


def tool_dicts(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools as plain dicts for the chat template (None when there are none)."""
    if not req.tools:
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]
