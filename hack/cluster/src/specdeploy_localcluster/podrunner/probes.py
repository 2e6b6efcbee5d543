"""Container probes and lifecycle hooks, run as a kubelet runs them: httpGet against the pod IP, tcpSocket,
exec (in the container's environment), and the `sleep` action of `preStop`."""

from __future__ import annotations

import http.client
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from specdeploy_localcluster.podnet import netns_exec

__all__ = ["ProbeState", "run_handler"]


def _port(container: Mapping[str, Any], port: int | str) -> int:
    if isinstance(port, int) or str(port).isdigit():
        return int(port)
    for item in container.get("ports") or []:
        if item.get("name") == port:
            return int(item["containerPort"])
    raise ValueError(f"container {container['name']!r} has no port named {port!r}")


def _http_get(spec: Mapping[str, Any], container: Mapping[str, Any], pod_ip: str, timeout: float) -> bool:
    host = spec.get("host") or pod_ip
    conn_class = http.client.HTTPSConnection if spec.get("scheme") == "HTTPS" else http.client.HTTPConnection
    conn = conn_class(host, _port(container, spec["port"]), timeout=timeout)
    try:
        headers = {h["name"]: h["value"] for h in spec.get("httpHeaders") or []}
        conn.request("GET", spec.get("path") or "/", headers={"User-Agent": "kube-probe/1.35", **headers})
        return 200 <= conn.getresponse().status < 400
    finally:
        conn.close()


def run_handler(
    handler: Mapping[str, Any],
    *,
    container: Mapping[str, Any],
    pod_ip: str,
    env: Mapping[str, str],
    timeout: float,
    netns: str,
) -> bool:
    """One probe or hook action; True on success. Errors (refused connection, timeout) are failures. exec
    actions run in the pod's network namespace, with the container's environment."""
    try:
        if "httpGet" in handler:
            return _http_get(handler["httpGet"], container, pod_ip, timeout)
        if "tcpSocket" in handler:
            spec = handler["tcpSocket"]
            with socket.create_connection(
                (spec.get("host") or pod_ip, _port(container, spec["port"])), timeout
            ):
                return True
        if "exec" in handler:
            argv = netns_exec(netns, handler["exec"]["command"])
            result = subprocess.run(argv, env=dict(env), capture_output=True, timeout=timeout, check=False)
            return result.returncode == 0
        if "sleep" in handler:
            time.sleep(float(handler["sleep"]["seconds"]))
            return True
    except (OSError, subprocess.SubprocessError, http.client.HTTPException, ValueError):
        return False
    return False


@dataclass
class ProbeState:
    """One probe of one container: when it is due and how many results in a row it has seen."""

    spec: Mapping[str, Any]
    started: float
    next_due: float = 0.0
    successes: int = 0
    failures: int = 0
    result: bool | None = None

    def __post_init__(self) -> None:
        self.next_due = self.started + float(self.spec.get("initialDelaySeconds", 0))

    @property
    def period(self) -> float:
        return float(self.spec.get("periodSeconds", 10))

    @property
    def timeout(self) -> float:
        return float(self.spec.get("timeoutSeconds", 1))

    def due(self, now: float) -> bool:
        return now >= self.next_due

    def record(self, ok: bool, now: float) -> bool | None:
        """Count one result; returns the probe's verdict once a threshold is reached (else the last one)."""
        self.next_due = now + self.period
        if ok:
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= int(self.spec.get("successThreshold", 1)):
                self.result = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= int(self.spec.get("failureThreshold", 3)):
                self.result = False
        return self.result
