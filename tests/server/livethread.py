"""Serve an ASGI app with uvicorn on 127.0.0.1: in a background thread, or on the running event loop."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import uvicorn


@dataclass
class LiveServer:
    base_url: str
    server: uvicorn.Server
    thread: threading.Thread
    app: Any


@contextmanager
def run_live(app: Any, graceful_seconds: int = 5) -> Iterator[LiveServer]:
    """Start ``app`` on a free port, yield once it accepts connections, stop it on exit."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=graceful_seconds
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    live = LiveServer(f"http://127.0.0.1:{port}", server, thread, app)
    try:
        yield live
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@asynccontextmanager
async def serve_on_loop(app: Any) -> AsyncIterator[str]:
    """``app`` under uvicorn on this event loop. The socket listens before the server starts, so clients can
    connect at once (they wait in the backlog until the application has started)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=10))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        await task
        sock.close()
