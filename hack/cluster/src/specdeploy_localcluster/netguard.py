"""Loopback-only guard: finds TCP/UDP sockets of given processes whose remote address is off this machine.

The local cluster, the operator, the pod runner's processes and every test may talk only to addresses on this
machine: 127.0.0.0/8, ::1, and the pod network the harness keeps on this machine (podnet.POD_NETWORK:
blackholed, with a network namespace of the harness's own behind each pod IP in use). `NetGuard` samples
the kernel's socket tables (`/proc/net/{tcp,tcp6,udp,udp6}`) in a background thread and remembers every
connection of a watched process to any other address; a caller (the pytest session) fails when
`violations` is not empty.

Sampling is cheap when nothing is wrong: the socket tables are read first, and only when a socket with a
non-loopback remote exists are the watched processes' file descriptors looked at to learn whose it is.
"""

from __future__ import annotations

import ipaddress
import os
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Connection", "NetGuard", "descendants", "offhost_sockets", "parse_socket_table"]

PROC = Path("/proc")
_TABLES = ("tcp", "tcp6", "udp", "udp6")
_TCP_LISTEN = "0A"


@dataclass(frozen=True)
class Connection:
    """One socket with a remote address off this machine."""

    protocol: str
    local: str
    remote: str
    state: str
    inode: int


def _decode_address(text: str) -> tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]:
    """`0100007F:1F90` (IPv4) or 32 hex digits (IPv6, four host-order 32-bit words) and a hex port."""
    host, port = text.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        return ipaddress.IPv4Address(raw[::-1]), int(port, 16)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, 16, 4))
    return ipaddress.IPv6Address(words), int(port, 16)


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def is_local(address: ipaddress.IPv4Address | ipaddress.IPv6Address, allowed: Iterable[Network] = ()) -> bool:
    """Loopback (127.0.0.0/8, ::1, ::ffff:127.x), unspecified (an unconnected socket), or in `allowed`."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified or any(address in net for net in allowed)


def parse_socket_table(protocol: str, text: str, allowed: Iterable[Network] = ()) -> list[Connection]:
    """The sockets of one `/proc/net/<protocol>` table whose remote address is off this machine (listening
    TCP sockets and unconnected UDP sockets have an unspecified remote and are never reported)."""
    allowed = list(allowed)
    found = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10:
            continue
        local, remote, state, inode = fields[1], fields[2], fields[3], int(fields[9])
        if protocol.startswith("tcp") and state == _TCP_LISTEN:
            continue
        remote_ip, remote_port = _decode_address(remote)
        if is_local(remote_ip, allowed):
            continue
        local_ip, local_port = _decode_address(local)
        found.append(
            Connection(protocol, f"{local_ip}:{local_port}", f"{remote_ip}:{remote_port}", state, inode)
        )
    return found


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _socket_inodes(pid: int) -> set[int]:
    inodes: set[int] = set()
    try:
        fds = list((PROC / str(pid) / "fd").iterdir())
    except OSError:
        return inodes
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def descendants(roots: Iterable[int]) -> set[int]:
    """`roots` and every living process below them (by parent pid)."""
    children: dict[int, list[int]] = {}
    for entry in PROC.iterdir():
        if not entry.name.isdigit():
            continue
        stat = _read(entry / "stat")
        if not stat:
            continue
        # pid (comm) state ppid ...: comm may hold spaces and parentheses, so split after the last ')'.
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    out: set[int] = set()
    todo = [pid for pid in roots if (PROC / str(pid)).exists()]
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        out.add(pid)
        todo.extend(children.get(pid, []))
    return out


def _command(pid: int) -> str:
    return _read(PROC / str(pid) / "cmdline").replace("\0", " ").strip()[:200]


def offhost_sockets(
    pids: Iterable[int], allowed: Iterable[Network] = ()
) -> list[tuple[int, str, Connection]]:
    """(pid, command line, connection) for every socket of `pids` whose remote is off this machine."""
    allowed = list(allowed)
    candidates = [
        conn for table in _TABLES for conn in parse_socket_table(table, _read(PROC / "net" / table), allowed)
    ]
    if not candidates:
        return []
    by_inode = {conn.inode: conn for conn in candidates}
    found = []
    for pid in pids:
        for inode in _socket_inodes(pid) & by_inode.keys():
            found.append((pid, _command(pid), by_inode[inode]))
    return found


class NetGuard:
    """Samples, every `interval` seconds, the sockets of the processes `roots()` names and of their
    descendants; `violations` lists each off-host connection once (by process, protocol and remote).
    `allowed`: networks that are on this machine besides loopback (the harness's pod network)."""

    def __init__(
        self, roots: Callable[[], Iterable[int]], allowed: Iterable[Network] = (), interval: float = 0.5
    ) -> None:
        self._roots = roots
        self._allowed = list(allowed)
        self._interval = interval
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen: dict[tuple[str, str, str], str] = {}
        self.samples = 0

    def sample(self) -> None:
        for pid, command, conn in offhost_sockets(descendants(self._roots()), self._allowed):
            key = (command, conn.protocol, conn.remote)
            if key not in self._seen:
                self._seen[key] = (
                    f"pid {pid} ({command}): {conn.protocol} {conn.local} -> {conn.remote} state {conn.state}"
                )
        self.samples += 1

    @property
    def violations(self) -> list[str]:
        return list(self._seen.values())

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            self.sample()

    def start(self) -> NetGuard:
        self._thread = threading.Thread(target=self._run, name="netguard", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> list[str]:
        """Stop sampling (after one last sample) and return the violations."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.sample()
        return self.violations
