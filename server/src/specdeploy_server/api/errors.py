"""Errors as types, mapped once to the OpenAI error shape ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from specdeploy_server.api import contract

#: what a 503 (queue full, shutting down) asks the client to wait, in seconds (its ``Retry-After``)
RETRY_AFTER_SECONDS = 1


class APIError(Exception):
    status = 500
    type = "server_error"
    code: str | None = None

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code

    def body(self) -> dict[str, Any]:
        detail = contract.ErrorDetail(message=self.message, type=self.type, param=self.param, code=self.code)
        return contract.body(contract.ErrorResponse(error=detail))

    def headers(self) -> dict[str, str]:
        """Headers every response with this error carries."""
        return {}


class BadRequestError(APIError):
    status = 400
    type = "invalid_request_error"


class AuthenticationError(APIError):
    status = 401
    type = "invalid_request_error"
    code = "invalid_api_key"


class ModelNotFoundError(APIError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class RouteNotFoundError(APIError):
    status = 404
    type = "invalid_request_error"
    code = "not_found"


class MethodNotAllowedError(APIError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


class PayloadTooLargeError(APIError):
    """The request body is larger than ``serving.maxRequestBodyBytes``."""

    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class OverloadedError(APIError):
    """The waiting queue is full, or the server is shutting down: retry later (or elsewhere)."""

    status = 503
    type = "overloaded_error"
    code = "queue_full"

    def headers(self) -> dict[str, str]:
        return {"Retry-After": str(RETRY_AFTER_SECONDS)}


def queue_full_error() -> OverloadedError:
    """The 503 ``queue_full`` refusal of the admission gate (the scheduler's own names its bound)."""
    return OverloadedError("the request queue is full")


def shutting_down_error() -> OverloadedError:
    return OverloadedError("the server is shutting down", code="shutting_down")


class InternalServerError(APIError):
    status = 500
    type = "server_error"
    code = "internal_error"


class ExecutorFailedError(InternalServerError):
    """The model executor failed this request (its message is passed on: it names the executor)."""

    code = "executor_error"


def error_response(exc: APIError, headers: dict[str, str] | None = None) -> JSONResponse:
    """The one rendering of an error: its OpenAI-shaped body, its status, its own headers (``Retry-After``)
    and any the caller adds."""
    return JSONResponse(exc.body(), status_code=exc.status, headers={**exc.headers(), **(headers or {})})
