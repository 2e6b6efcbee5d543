"""The loopback-only guard: which sockets count as off this machine, and whose they are."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys

from specdeploy_localcluster.netguard import NetGuard, descendants, offhost_sockets, parse_socket_table

# Lines in the kernel's format (/proc/net/tcp): sl, local, remote, state, ..., inode (10th field).
_HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n"


def _line(local: str, remote: str, state: str, inode: int) -> str:
    return f"   0: {local} {remote} {state} 00000000:00000000 00:00000000 00000000     0        0 {inode} 1\n"


def test_a_kubelet_connection_to_a_private_address_is_reported() -> None:
    # 10.0.2.15:43210 -> 10.250.0.1:10250, ESTABLISHED: what kube-apiserver did for `kubectl logs` when
    # simulated nodes reported InternalIP 10.250.0.1.
    text = _HEADER + _line("0F02000A:A8CA", "0100FA0A:280A", "01", 4242)
    [conn] = parse_socket_table("tcp", text)
    assert conn.remote == "10.250.0.1:10250"
    assert conn.local == "10.0.2.15:43210"
    assert conn.inode == 4242


def test_loopback_listening_and_unconnected_sockets_are_not_reported() -> None:
    text = (
        _HEADER
        + _line("0100007F:1F90", "0101017F:C350", "01", 1)  # 127.0.0.1:8080 -> 127.1.1.1:50000
        + _line("00000000:1F90", "00000000:0000", "0A", 2)  # listening on 0.0.0.0:8080
        + _line("0F02000A:1F90", "00000000:0000", "0A", 3)  # listening on 10.0.2.15:8080
    )
    assert parse_socket_table("tcp", text) == []


def test_ipv6_loopback_and_v4_mapped_loopback_are_local_but_a_public_v6_address_is_not() -> None:
    loopback6 = "00000000000000000000000001000000"  # ::1
    mapped = "0000000000000000FFFF00000100007F"  # ::ffff:127.0.0.1
    public = "B80D0120000000000000000001000000"  # 2001:db8::1
    text = (
        _HEADER
        + _line(f"{loopback6}:1F90", f"{loopback6}:C350", "01", 1)
        + _line(f"{mapped}:1F90", f"{mapped}:C350", "01", 2)
        + _line(f"{loopback6}:1F90", f"{public}:01BB", "02", 3)
    )
    [conn] = parse_socket_table("tcp6", text)
    assert conn.remote == "2001:db8::1:443"
    assert conn.state == "02"


def test_the_pod_network_is_local_only_when_the_caller_says_so() -> None:
    # 127.0.0.1:43210 -> 198.18.0.254:8000 (a pod IP of the local cluster)
    text = _HEADER + _line("0100007F:A8CA", "FE0012C6:1F40", "01", 9)
    assert [c.remote for c in parse_socket_table("tcp", text)] == ["198.18.0.254:8000"]
    assert parse_socket_table("tcp", text, [ipaddress.IPv4Network("198.18.0.0/15")]) == []


def test_connected_udp_sockets_count_too() -> None:
    # A DNS query to a resolver elsewhere (10.0.0.2:53) is traffic off this machine as well.
    text = _HEADER + _line("0F02000A:D431", "0200000A:0035", "01", 7)
    [conn] = parse_socket_table("udp", text)
    assert conn.remote == "10.0.0.2:53"


def test_descendants_include_children_of_children() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import subprocess,sys; subprocess.run(['sleep','5'])"],
        start_new_session=True,
    )
    try:
        for _ in range(100):
            tree = descendants([os.getpid()])
            if len(tree) >= 3:
                break
            subprocess.run(["sleep", "0.05"], check=True)
        assert {os.getpid(), child.pid} <= tree
        assert len(tree - {os.getpid(), child.pid}) >= 1
    finally:
        child.kill()
        child.wait()


def test_a_live_loopback_connection_of_this_process_is_not_a_violation() -> None:
    server = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    try:
        ours = {f"127.0.0.1:{client.getsockname()[1]}", f"127.0.0.1:{accepted.getsockname()[1]}"}
        # This process may hold other sockets (earlier tests of the session); these two are never reported.
        assert [c for _, _, c in offhost_sockets([os.getpid()]) if c.local in ours] == []
        guard = NetGuard(lambda: [os.getpid()])
        guard.sample()
        assert not [v for v in guard.violations if any(local in v for local in ours)]
        assert guard.samples == 1
    finally:
        for s in (accepted, client, server):
            s.close()
