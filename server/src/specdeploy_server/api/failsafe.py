"""The last line of error handling: no request ends in an exception that closes its connection unannounced.

Starlette's own error middleware sends a 500 and then re-raises, and uvicorn closes the connection of a
request whose application raised, so a pooled client's next request on that socket failed. This middleware
sits inside it and answers an exception the application did not handle with a 500 in OpenAI's error shape,
without re-raising: the connection stays usable. An exception after the response has started (a stream's
headers are sent) cannot be answered any more; it is passed on, and the connection is closed, which is all
a client can be told then (streams report their own failures in-band before that).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specdeploy_server.api.errors import APIError, InternalServerError, error_response

log = logging.getLogger(__name__)


class InternalErrors:
    """Pure ASGI middleware: an unhandled exception -> 500 JSON (``on_error`` told of it). It also tells
    ``on_done(scope, status)`` how each HTTP request ended (the status sent, 500 when none was): the
    request counters read it here, so that a streamed event passes one wrapper of ``send``, not two."""

    def __init__(
        self,
        app: ASGIApp,
        on_error: Callable[[APIError], None],
        on_done: Callable[[Scope, int], None] | None = None,
    ) -> None:
        self.app = app
        self.on_error = on_error
        self.on_done = on_done

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0  # none sent yet

        async def tracking(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, tracking)
        except Exception:
            if status:
                raise
            log.exception("unhandled error in %s %s", scope.get("method", ""), scope.get("path", ""))
            error = InternalServerError("the server had an error while processing the request")
            self.on_error(error)
            status = error.status
            await error_response(error)(scope, receive, send)
        finally:
            if self.on_done is not None:
                self.on_done(scope, status or 500)
