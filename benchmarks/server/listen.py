"""A listening socket on a free loopback port, bound before any server process starts: the benchmarks' servers
are handed the socket itself (uvicorn's ``sockets=``; a spawned child receives it pickled), so no other
process can take the port between the moment it is picked and the moment it is served."""

from __future__ import annotations

import socket

BACKLOG = 4096


def listening_socket() -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(BACKLOG)
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{host}:{port}"
