"""Request bodies over ``serving.maxRequestBodyBytes`` get 413 without being read whole.

A declared ``Content-Length`` over the limit is refused before the application runs; a body without one
(chunked) is counted as it arrives and refused at the first chunk that crosses the limit. Nothing is kept.

Before the 413 goes out, up to ``DRAIN_BYTES`` more of the body are read and thrown away (for at most
``DRAIN_SECONDS``): a client that sends its whole body before reading the answer, as most do, then reads a
clean 413 instead of a connection reset (a server that closes a socket with unread data makes the kernel reset
it, which can destroy the response before the client reads it; nginx's lingering close does the same). A body
that goes on beyond that is not read further: the 413 is sent and the connection closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Callable

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from specdeploy_server.api.errors import PayloadTooLargeError

DEFAULT_MAX_REQUEST_BODY_BYTES = 16 * 1024 * 1024
DRAIN_BYTES = 1024 * 1024
DRAIN_SECONDS = 2.0


class BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a streamed body crosses the limit; an HTTPException so that FastAPI passes
    it on unchanged while reading the body (the app's handler turns it into a 413)."""

    def __init__(self, limit: int) -> None:
        super().__init__(status_code=413, detail=too_large_message(limit))


def too_large_message(limit: int) -> str:
    return f"the request body exceeds {limit} bytes (serving.maxRequestBodyBytes)"


def declared_length(scope: Scope) -> int | None:
    value = Headers(scope=scope).get("content-length")
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


class BodySizeLimit:
    """Pure ASGI middleware (keeps disconnect detection and streaming intact)."""

    def __init__(self, app: ASGIApp, max_bytes: int, on_refused: Callable[[], None] = lambda: None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.on_refused = on_refused  # counts a 413 sent before the application ran

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.max_bytes
        declared = declared_length(scope)
        if declared is not None and declared > limit:
            if declared <= limit + DRAIN_BYTES:
                await drain(receive, DRAIN_BYTES)
            self.on_refused()
            await _refuse(send, limit)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    if message.get("more_body", False):
                        await drain(receive, DRAIN_BYTES)
                    raise BodyTooLarge(limit)
            return message

        await self.app(scope, counted, send)


async def drain(receive: Receive, max_bytes: int, max_seconds: float = DRAIN_SECONDS) -> bool:
    """Read and discard the rest of a body, up to ``max_bytes`` and ``max_seconds``; True if it ended."""
    deadline = time.monotonic() + max_seconds
    discarded = 0
    while discarded <= max_bytes:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        message: Message | None = None
        with contextlib.suppress(TimeoutError):
            message = await asyncio.wait_for(receive(), remaining)
        if message is None or message["type"] != "http.request":
            return False
        discarded += len(message.get("body", b""))
        if not message.get("more_body", False):
            return True
    return False


async def _refuse(send: Send, limit: int) -> None:
    body = json.dumps(PayloadTooLargeError(too_large_message(limit)).body()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
