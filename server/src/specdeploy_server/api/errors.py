"""Errors as types, mapped once to the OpenAI error shape ``{"error": {message, type, param, code}}``."""

from __future__ import annotations

from typing import Any


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
        return error_body(self.message, self.type, self.param, self.code)


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


class InternalServerError(APIError):
    status = 500
    type = "server_error"
    code = "internal_error"


class ExecutorFailedError(InternalServerError):
    """The model executor failed this request (its message is passed on: it names the executor)."""

    code = "executor_error"


def error_body(message: str, type_: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}
