"""The local cluster's pod network: pod IPs that never leave this machine.

EndpointSlices refuse loopback addresses, so pods cannot live in 127.0.0.0/8. They get addresses from
`POD_NETWORK` (198.18.0.0/15, the range RFC 2544 sets aside for benchmarking, which no real network routes)
instead, and this machine keeps that whole range to itself:

- a `blackhole` route for `POD_NETWORK`: a connection to any pod IP that has no pod behind it (every pod kwok
  simulates) fails at once here instead of following the default route off this machine;
- each pod the pod runner runs gets a network namespace of its own (as a CNI plugin gives it), joined to
  this machine by a veth pair: the pod's `eth0` holds its IP, the host end holds `GATEWAY` (link-local),
  and a /32 route sends the pod IP into the pair. The pod namespace has no default route (and this machine
  does not forward), so a pod can answer this machine and reach nothing else.

Several local clusters may run at once (the test session's, a test's own): each claims one slot of
`POD_NETWORK` (`SLOT_PREFIX` bits; a registry under `REGISTRY`), whose first half is its node IPAM range
(`--cluster-cidr`, one /25 per node) and whose second half kwok's fallback range (pods of a node without a
podCIDR yet). Everything here needs root (CAP_NET_ADMIN), as a kubelet does.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Final

__all__ = [
    "GATEWAY",
    "NODE_POD_CIDR_MASK",
    "POD_NETWORK",
    "PodNetworkError",
    "claim_slot",
    "create_pod_netns",
    "delete_pod_netns",
    "netns_exec",
    "netns_name",
    "release_slot",
    "slot_ranges",
]

POD_NETWORK: Final = ipaddress.IPv4Network("198.18.0.0/15")
SLOT_PREFIX: Final = 18
NODE_POD_CIDR_MASK: Final = 25
GATEWAY: Final = "169.254.1.1"
REGISTRY: Final = Path("/run/specdeploy-podnet")


class PodNetworkError(RuntimeError):
    """The pod network could not be set up (not root, no `ip`, every slot taken)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    except FileNotFoundError as err:
        raise PodNetworkError("the pod network needs iproute2's `ip` command") from err
    if check and proc.returncode != 0:
        raise PodNetworkError(f"ip {' '.join(args)}: {proc.stderr.strip()} (the pod network needs root)")
    return proc


def slot_ranges(slot: int) -> tuple[str, str]:
    """(node IPAM range, kwok's fallback range) of a slot."""
    block = list(POD_NETWORK.subnets(new_prefix=SLOT_PREFIX))[slot]
    ipam, fallback = block.subnets(prefixlen_diff=1)
    return str(ipam), str(fallback)


@contextlib.contextmanager
def _registry() -> Iterator[Path]:
    REGISTRY.mkdir(parents=True, exist_ok=True)
    with (REGISTRY / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield REGISTRY


def _owner_alive(owner: Path) -> bool:
    return (owner / "state.json").is_file()


def claim_slot(cluster_dir: Path) -> int:
    """A slot of `POD_NETWORK` for the cluster in `cluster_dir` (its own if it has one), and the blackhole
    route for the whole range."""
    cluster_dir = cluster_dir.resolve()
    slots = len(list(POD_NETWORK.subnets(new_prefix=SLOT_PREFIX)))
    with _registry() as registry:
        free = None
        for slot in range(slots):
            entry = registry / f"slot-{slot}"
            owner = Path(entry.read_text().strip()) if entry.exists() else None
            if owner == cluster_dir:
                free = slot
                break
            if free is None and (owner is None or not _owner_alive(owner)):
                free = slot
        if free is None:
            raise PodNetworkError(f"all {slots} pod-network slots are taken by running local clusters")
        (registry / f"slot-{free}").write_text(f"{cluster_dir}\n")
        _ip("route", "replace", "blackhole", str(POD_NETWORK))
        return free


def release_slot(cluster_dir: Path) -> None:
    """Give the cluster's slot back; the blackhole route goes with the last slot."""
    cluster_dir = cluster_dir.resolve()
    with _registry() as registry:
        in_use = 0
        for entry in registry.glob("slot-*"):
            owner = Path(entry.read_text().strip())
            if owner == cluster_dir or not _owner_alive(owner):
                entry.unlink()
            else:
                in_use += 1
        if in_use == 0:
            _ip("route", "del", "blackhole", str(POD_NETWORK), check=False)


def netns_name(uid: str) -> str:
    """The pod's network namespace; also its host-side veth name (at most 15 characters)."""
    return f"sdp{uid.replace('-', '')[:12]}"


def netns_exec(name: str, argv: list[str]) -> list[str]:
    """`argv` run inside the pod network namespace `name`."""
    return ["ip", "netns", "exec", name, *argv]


def create_pod_netns(uid: str, pod_ip: str) -> str:
    """A network namespace holding `pod_ip` on its `eth0`, reachable from this machine only."""
    name = netns_name(uid)
    delete_pod_netns(uid, pod_ip)
    _ip("netns", "add", name)
    _ip("link", "add", name, "type", "veth", "peer", "name", "eth0", "netns", name)
    _ip("addr", "add", f"{GATEWAY}/32", "dev", name)
    _ip("link", "set", name, "up")
    _ip("-n", name, "link", "set", "lo", "up")
    _ip("-n", name, "addr", "add", f"{pod_ip}/32", "dev", "eth0")
    _ip("-n", name, "link", "set", "eth0", "up")
    _ip("-n", name, "route", "add", GATEWAY, "dev", "eth0")
    _ip("route", "replace", f"{pod_ip}/32", "dev", name)
    return name


def delete_pod_netns(uid: str, pod_ip: str) -> None:
    """Remove the pod's namespace, its veth pair and its route (nothing left is fine)."""
    name = netns_name(uid)
    _ip("route", "del", f"{pod_ip}/32", "dev", name, check=False)
    _ip("link", "del", name, check=False)
    _ip("netns", "del", name, check=False)
