"""``response_format`` and ``tools`` -> a grammar (llguidance), and generated tool calls -> the OpenAI shape.

Accepted ``response_format`` types (as llgtrt): ``text``; ``json_object`` (any JSON object);
``json_schema`` (``{"json_schema": {"name": ..., "schema": {...}}}``); ``lark_grammar``
(``{"lark_grammar": "<Lark source>"}``, llguidance's Lark dialect); ``llguidance`` (``{"grammar": {...}}``,
a top-level llguidance grammar). ``tool_choice: "required"`` or a named function constrains the output to
``{"name": <a tool's name>, "arguments": <that tool's parameters>}``.

Objects are closed (:func:`closed_schema`): an object schema that declares ``properties`` and does not say
``additionalProperties`` gets ``additionalProperties: false``, as vLLM's default grammar backend (xgrammar,
strict mode) does, so the model cannot invent keys a client's own model then refuses. ``strict: true`` (a
``json_schema`` response format's, a function's) is OpenAI's: no object may take extra keys, so a schema that
allows them there is a 400. An object schema without ``properties`` (``{"type": "object"}``, a free-form
dictionary) stays open either way.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from typing import Any

from specdeploy_server.api.errors import BadRequestError
from specdeploy_server.api.protocol import ChatCompletionRequest, CompletionRequest, Tool
from specdeploy_server.engine import EngineClient
from specdeploy_server.grammar import GrammarCompiler, Guide

RESPONSE_FORMAT_TYPES = ("text", "json_object", "json_schema", "lark_grammar", "llguidance")
_ANY_OBJECT: dict[str, Any] = {"type": "object"}

log = logging.getLogger(__name__)


def requested_guide(req: CompletionRequest | ChatCompletionRequest) -> Guide | None:
    """What the request's output must follow, or None (raises BadRequestError)."""
    tools = isinstance(req, ChatCompletionRequest) and req.calls_tools()
    fmt = req.response_format or {}
    kind = fmt.get("type", "text")
    if tools:
        if kind != "text":
            raise BadRequestError(
                "response_format cannot be combined with tools and tool_choice", param="response_format"
            )
        assert isinstance(req, ChatCompletionRequest)
        return Guide("json_schema", json.dumps(tool_call_schema(req)))
    if kind == "text":
        return None
    if kind == "json_object":
        return Guide("json_object")
    if kind == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise BadRequestError(
                "response_format json_schema needs json_schema.schema (an object)", param="response_format"
            )
        strict = spec.get("strict") is True if isinstance(spec, dict) else False
        return Guide("json_schema", json.dumps(closed_schema(schema, strict, "response_format")))
    if kind == "lark_grammar":
        lark = fmt.get("lark_grammar")
        if not isinstance(lark, str) or not lark.strip():
            raise BadRequestError(
                "response_format lark_grammar needs lark_grammar (Lark source)", param="response_format"
            )
        return Guide("lark", lark)
    if kind == "llguidance":
        grammar = fmt.get("grammar")
        if not isinstance(grammar, dict):
            raise BadRequestError(
                "response_format llguidance needs grammar (an object)", param="response_format"
            )
        return Guide("llguidance", json.dumps(grammar))
    raise BadRequestError(
        f"response_format type '{kind}' is not supported; use one of {', '.join(RESPONSE_FORMAT_TYPES)}",
        param="response_format",
    )


_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMAS = ("items", "additionalItems", "not", "if", "then", "else", "contains", "additionalProperties")


def closed_schema(schema: Any, strict: bool, param: str) -> Any:
    """``schema`` with every object that declares ``properties`` and says nothing of ``additionalProperties``
    closed (``additionalProperties: false``); with ``strict``, an object that allows extra keys is a 400
    naming ``param``. A new schema; ``schema`` is left as it was."""
    if isinstance(schema, list):
        return [closed_schema(item, strict, param) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _SUBSCHEMA_MAPS and isinstance(value, dict):
            out[key] = {name: closed_schema(sub, strict, param) for name, sub in value.items()}
        elif key in _SUBSCHEMA_LISTS or key in _SUBSCHEMAS:
            out[key] = closed_schema(value, strict, param)
        else:
            out[key] = value
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if strict and out.get("additionalProperties", False) is not False and "properties" in out:
        raise BadRequestError(
            "with strict: true an object schema must not allow additional properties "
            "(additionalProperties must be false)",
            param=param,
        )
    return out


def _call_schema(tool: Tool) -> dict[str, Any]:
    parameters = tool.function.parameters or {"type": "object", "properties": {}}
    parameters = closed_schema(parameters, tool.function.strict is True, "tools")
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


#: the opening of a call object, up to its arguments: ``{"name": "<tool>", "arguments"|"parameters": ``
CALL_HEAD = re.compile(r'\{\s*"name"\s*:\s*"([A-Za-z0-9_.-]{1,64})"\s*,\s*"(?:arguments|parameters)"\s*:\s*')


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{uuid.uuid4().hex[:24]}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def before_closing_brace(text: str) -> str:
    """The arguments' part of a call object's text after its :data:`CALL_HEAD`: less trailing whitespace, one
    last ``}`` (the object's) and the whitespace before it."""
    text = text.rstrip()
    return text[:-1].rstrip() if text.endswith("}") else text


def _arguments_text(source: str, arguments: object) -> str:
    """The arguments' JSON text as the model wrote it in ``source`` (a call object opening with its name), so
    that what a stream sent concatenates to this value; re-serialised when the object is of another form."""
    stripped = source.strip()
    head = CALL_HEAD.match(stripped)
    if head is not None and stripped.endswith("}"):
        text = before_closing_brace(stripped[head.end() :])
        try:
            if json.loads(text) == arguments:
                return text
        except ValueError:
            pass
    return json.dumps(arguments, ensure_ascii=False)


def as_call(obj: object, names: frozenset[str] | None, source: str = "") -> dict[str, Any] | None:
    """``{"name": ..., "arguments" | "parameters": ...}`` (naming one of ``names``, when given) as a call,
    its arguments the text they have in ``source`` (the object's JSON text) where they can be found there."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if names is not None and obj["name"] not in names:
        return None
    key = "arguments" if "arguments" in obj else "parameters" if "parameters" in obj else None
    if key is None:
        return None
    return _call(obj["name"], _arguments_text(source, obj[key]))


def tool_calls_from(text: str) -> list[dict[str, Any]] | None:
    """A forced call's text as OpenAI ``tool_calls``; None when the text is not a complete call (the output
    was cut by max_tokens)."""
    try:
        call = as_call(json.loads(text), None, text)
    except json.JSONDecodeError:
        return None
    return [call] if call is not None else None


_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def auto_tool_calls(text: str, names: frozenset[str]) -> tuple[str | None, list[dict[str, Any]]] | None:
    """The calls a model made on its own (``tool_choice: auto``), in the two formats chat templates ask for:
    ``<tool_call>{"name": …, "arguments": …}</tool_call>`` blocks (Hermes, Qwen), or the whole answer being
    one ``{"name": …, "parameters"|"arguments": …}`` object (Llama 3.1+). Returns the text before the first
    call (None when empty) and the calls; None when the text holds no call of a known tool."""
    blocks = _TAGGED.findall(text)
    calls: list[dict[str, Any]] = []
    for block in blocks:
        try:
            call = as_call(json.loads(block), names, block)
        except json.JSONDecodeError:
            call = None
        if call is not None:
            calls.append(call)
    if calls:
        before = text[: text.index("<tool_call>")].strip()
        return (before or None), calls
    stripped = text.strip()
    if stripped.startswith("{"):
        try:
            call = as_call(json.loads(stripped), names, stripped)
        except json.JSONDecodeError:
            call = None
        if call is not None:
            return None, [call]
    return None


def tool_dicts(req: ChatCompletionRequest) -> list[dict[str, Any]] | None:
    """The tools as plain dicts for the chat template (None when there are none)."""
    if not req.tools:
        return None
    return [t.model_dump(exclude_none=True) for t in req.tools]


def structured_output(engine: EngineClient) -> tuple[GrammarCompiler | None, str | None]:
    """The grammar compiler for the served tokenizer, or why structured output is not available: decided
    once, at start-up (the grammar engine indexes the vocabulary then), and logged once."""
    hf = getattr(engine.tokenizer, "hf", None)
    vocab = engine.info.vocab_size
    if hf is None or vocab is None:
        problem = "it needs a Hugging Face tokenizer and a known vocabulary size"
        log.info("structured output (response_format, tools) is not available: %s", problem)
        return None, problem
    compiler = GrammarCompiler(hf, vocab, engine.tokenizer.eos_token_ids)
    try:
        compiler.tokenizer  # noqa: B018 (builds the grammar engine's index of the vocabulary)
    except Exception as exc:  # llguidance refuses tokenizers it cannot read, with various errors
        problem = f"the grammar engine cannot read this tokenizer ({type(exc).__name__}: {exc})"
        log.warning("structured output (response_format, tools) is not available: %s", problem)
        return None, problem
    log.info("structured output (response_format, tools) is available")
    return compiler, None
