"""What the OpenAPI document says ``/v1/responses`` answers: the response object, or with ``stream: true``
its typed events (``event: <type>`` and ``data: {json}``, no ``[DONE]``); a stored response, or a 404."""

from __future__ import annotations

from typing import Any

from specdeploy_server.api import openapi
from specdeploy_server.api.contract import ErrorResponse
from specdeploy_server.api.responses_api.contract import EVENT_MODELS, DeletedResponse, Response


def _events() -> dict[str, Any]:
    """One server-sent event: its ``event`` field names its type, its ``data`` is that event."""
    events = {"anyOf": [{"$ref": f"#/components/schemas/{model.__name__}"} for model in EVENT_MODELS]}
    data = {"type": "string", "contentMediaType": "application/json", "contentSchema": events}
    return {
        "schema": {
            "type": "object",
            "required": ["event", "data"],
            "properties": {"event": {"type": "string"}, "data": data},
        }
    }


def _error(description: str) -> dict[str, Any]:
    return {"model": ErrorResponse, "description": description}


CREATE_RESPONSES: dict[int | str, dict[str, Any]] = {
    **openapi.generation_responses(Response, Response),
    200: {
        "model": Response,
        "description": "The response, or with `stream: true` its events as server-sent events "
        "(`event: <type>` and `data: {json}` lines; the last is `response.completed`, "
        "`response.incomplete` or `response.failed`).",
        "content": {"text/event-stream": _events()},
    },
}
_LOOKUP: dict[int | str, dict[str, Any]] = {
    401: _error("Missing or wrong API key (`Authorization: Bearer <key>`)."),
    404: _error("No stored response has this id on this replica (`not_found`)."),
    500: _error("An unexpected error."),
}
GET_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": Response, "description": "The stored response."},
    **_LOOKUP,
}
DELETE_RESPONSES: dict[int | str, dict[str, Any]] = {
    200: {"model": DeletedResponse, "description": "The response was deleted."},
    **_LOOKUP,
}
