"""Processes and ports of the local cluster, by pid and by loopback port: the standard library only (`down`
and `status` need nothing else).

A port for another process to bind comes from `free_port`: free when chosen, it can be taken by anything else
on this machine before that process binds it. Whoever starts such a process wraps the start in
`retry_on_taken_port` and raises `PortTaken` when the process says so (`port_taken`). A port that this process
binds itself is bound to port 0 and kept bound; a tool that can pick its own port (`kubectl port-forward :N`)
is left to pick it."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Final, TypeVar

T = TypeVar("T")

PORT_ATTEMPTS: Final = 5
# What Go's net package, Python's socket module (errno 98) and uvicorn say when a port is taken.
_PORT_IN_USE: Final = "address already in use"

log = logging.getLogger("localcluster")


class PortTaken(RuntimeError):
    """A process could not listen on a port chosen for it: something else took the port after `free_port`."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (see the module's docstring)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_taken(output: str) -> bool:
    """Whether a process's output says that it could not bind a port because something else has it."""
    return _PORT_IN_USE in output.lower()


def output_since(log: Path, offset: int) -> str:
    """What was appended to the log file `log` after `offset` (a process's output since it started)."""
    try:
        with log.open("rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def retry_on_taken_port(
    start: Callable[[], T], undo: Callable[[], object] = lambda: None, attempts: int = PORT_ATTEMPTS
) -> T:
    """`start()`, which chooses its ports with `free_port`; when it raises `PortTaken`, `undo()` what it
    left behind and start again on other ports, `attempts` times in all."""
    for attempt in range(1, attempts + 1):
        try:
            return start()
        except PortTaken as taken:
            undo()
            if attempt == attempts:
                raise
            log.warning("%s: starting again on other ports", str(taken).splitlines()[0])
    raise ValueError(f"attempts={attempts}: a start needs at least one")


def port_open(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:`port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.2)
        return s.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int) -> bool:
    """Whether the process exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie child still answers kill(0); treat it as dead.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout: float) -> bool:
    """Wait until every process has fully exited. A zombie thread-group leader can still have threads (and
    listening sockets) being torn down, so "gone" means reaped: reap our own children, and wait for others'
    /proc entries to disappear (init reaps processes whose starter has exited)."""
    deadline = time.monotonic() + timeout
    while True:
        for pid in pids:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
        if not any(Path(f"/proc/{pid}").exists() for pid in pids):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def pid_start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22): with the pid,
    it identifies one process for good, so a recycled pid is never mistaken for ours."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def stop_groups(pids: list[int], timeout: float) -> None:
    """SIGTERM the process groups these session leaders lead; SIGKILL what is left after `timeout`, then
    wait (5 s at most) for it to go."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    if not wait_gone(pids, timeout):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        wait_gone(pids, 5.0)
