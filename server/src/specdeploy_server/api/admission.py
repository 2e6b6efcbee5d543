"""Refuse generation requests at their headers while the server cannot take them.

A request the engine would refuse anyway (its queue is full, or the server is draining) is answered 503 as
soon as its headers are in, before its body is read, parsed and validated: under a flood of requests beyond
the queue bound, refusing costs the event loop next to nothing, so the refusals stay fast and the requests
being served keep the loop.

The checks keep the order the API documents: a request the API key does not authorize is let through to get
its 401 (only an authorized request learns that the server is overloaded). The gate answers only
``POST /v1/completions`` and ``POST /v1/chat/completions``; health, metrics and the model list are never
gated. The refusal is the same error (body, status, ``Retry-After``) the handlers raise.

The body the gate did not read is left to uvicorn, which discards what still arrives and keeps the connection
(no ``Connection: close``: closing a socket with unread data would make the kernel reset it, possibly before
the client read the 503).
"""

from __future__ import annotations

import hmac
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from specdeploy_server.api.errors import OverloadedError, error_response

GENERATION_PATHS = frozenset({"/v1/completions", "/v1/chat/completions"})


def authorized(headers: Headers, api_key: str | None) -> bool:
    """Whether the request carries the API key (``Authorization: Bearer <key>``); True when none is set."""
    if api_key is None:
        return True
    scheme, _, token = headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), api_key.encode())


class AdmissionGate:
    """Pure ASGI middleware: ``refusal()`` says why the server takes no generation request now (None: it
    does); ``on_refused`` counts each refusal sent (the error metric)."""

    def __init__(
        self,
        app: ASGIApp,
        refusal: Callable[[], OverloadedError | None],
        api_key: str | None,
        on_refused: Callable[[OverloadedError], None] = lambda _: None,
    ) -> None:
        self.app = app
        self.refusal = refusal
        self.api_key = api_key
        self.on_refused = on_refused

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] in GENERATION_PATHS:
            error = self.refusal()
            if error is not None and authorized(Headers(scope=scope), self.api_key):
                self.on_refused(error)
                await error_response(error)(scope, receive, send)
                return
        await self.app(scope, receive, send)
