"""The OpenAPI document tells the truth: every status a route answers with, each error in the OpenAI error
shape, ``text/event-stream`` for streams and Prometheus text for ``/metrics``. The bodies' schemas are those
of the models the handlers build them from (``api/contract.py``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from specdeploy_server.api.contract import (
    ChatCompletionChunk,
    CompletionChunk,
    ErrorResponse,
    Health,
    ModelCard,
    ModelList,
)
from specdeploy_server.api.responses_api.contract import EVENT_MODELS


def _event_stream(chunk: type[BaseModel]) -> dict[str, Any]:
    """One server-sent event (OpenAPI 3.1: the schema of ``text/event-stream`` describes each event): ``data``
    is a chunk, an in-band error (a failure after the headers were sent), or the final ``[DONE]``."""
    payload = {"anyOf": [{"$ref": f"#/components/schemas/{chunk.__name__}"}, _ERROR_REF]}
    data = {
        "anyOf": [
            {"type": "string", "const": "[DONE]"},
            {"type": "string", "contentMediaType": "application/json", "contentSchema": payload},
        ]
    }
    return {"schema": {"type": "object", "required": ["data"], "properties": {"data": data}}}


_ERROR_REF = {"$ref": "#/components/schemas/ErrorResponse"}


def _error(description: str, headers: dict[str, Any] | None = None) -> dict[str, Any]:
    response: dict[str, Any] = {"model": ErrorResponse, "description": description}
    if headers:
        response["headers"] = headers
    return response


RETRY_AFTER = {
    "Retry-After": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}
}
_UNAUTHORIZED: dict[int | str, dict[str, Any]] = {
    401: _error("Missing or wrong API key (`Authorization: Bearer <key>`).")
}
_INTERNAL: dict[int | str, dict[str, Any]] = {
    500: _error("An unexpected error, or the model executor failed the request (`executor_error`).")
}

MODELS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": ModelList, "description": "The served model."},
    **_UNAUTHORIZED,
    **_INTERNAL,
}
MODEL_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": ModelCard, "description": "The served model."},
    **_UNAUTHORIZED,
    404: _error("No such model (`model_not_found`)."),
    **_INTERNAL,
}


def generation_responses(success: type[BaseModel], chunk: type[BaseModel]) -> dict[int | str, dict[str, Any]]:
    """The statuses of /v1/completions and /v1/chat/completions; 200 is JSON, or an SSE stream with
    ``stream: true`` (an executor failure after the headers ends the stream with an in-band error event)."""
    return {
        200: {
            "model": success,
            "description": "The completion, or with `stream: true` its chunks as server-sent events "
            "(`data: {json}` lines, then `data: [DONE]`).",
            "content": {"text/event-stream": _event_stream(chunk)},
        },
        400: _error("Invalid request: malformed JSON, a wrong field, too many tokens, unsupported option."),
        **_UNAUTHORIZED,
        404: _error("No such model (`model_not_found`)."),
        413: _error("The request body exceeds `serving.maxRequestBodyBytes` (`request_too_large`)."),
        **_INTERNAL,
        503: _error(
            "The request queue is full (`queue_full`) or the server is shutting down (`shutting_down`).",
            headers=RETRY_AFTER,
        ),
    }


HEALTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": Health, "description": "Live (or ready)."},
    503: {"model": Health, "description": "Not ready: the engine is starting, stopped, or draining."},
}

METRICS_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Prometheus text exposition format 0.0.4.",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    }
}


STREAM_CHUNKS: tuple[type[BaseModel], ...] = (CompletionChunk, ChatCompletionChunk, *EVENT_MODELS)


def _definitions(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    nested = schema.pop("$defs", {})
    return {**nested, model.__name__: schema}


def openapi_document(app: FastAPI, served_model_names: Sequence[str] = ()) -> dict[str, Any]:
    """FastAPI's document without what this server never answers: 422 (validation errors are 400 here)
    and the JSON body FastAPI assumes for a route that returns a plain ``Response`` (``/metrics``); with the
    served model's names as the values of every request body's ``model`` (a schema-driven client then
    reaches the generation path instead of a 404 for a made-up name)."""
    if app.openapi_schema is not None:
        return app.openapi_schema
    document = get_openapi(title=app.title, version=app.version, routes=app.routes)
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.get("responses", {})
            responses.pop("422", None)
            ok = responses.get("200", {}).get("content", {})
            if "text/plain" in ok:
                ok.pop("application/json", None)
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for model in STREAM_CHUNKS:  # referenced only from inside the event schemas
        schemas.update(_definitions(model))
    for unused in ("HTTPValidationError", "ValidationError"):
        schemas.pop(unused, None)
    if served_model_names:
        for name in _request_bodies(document):
            model = schemas.get(name, {}).get("properties", {}).get("model")
            if isinstance(model, dict) and model.get("type") == "string":
                model["enum"] = list(served_model_names)
    app.openapi_schema = document
    return document


def _request_bodies(document: dict[str, Any]) -> set[str]:
    """The component names of every operation's JSON request body."""
    out: set[str] = set()
    for operations in document.get("paths", {}).values():
        for operation in operations.values():
            content = operation.get("requestBody", {}).get("content", {})
            ref = content.get("application/json", {}).get("schema", {}).get("$ref", "")
            if ref.startswith("#/components/schemas/"):
                out.add(ref.rsplit("/", 1)[1])
    return out
