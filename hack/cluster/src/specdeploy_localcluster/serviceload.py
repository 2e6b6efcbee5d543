"""Load through a Service of the local cluster, for tests and benchmarks: reaching a Service the way
kube-proxy would, without kube-proxy. Every new connection goes to one of the Service's *ready* endpoints
as its EndpointSlices list them at that moment (round robin), never to the ClusterIP (which would be traffic
to an address off this machine). No retries: a failure is the caller's.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
from kubernetes import client

__all__ = ["LoadReport", "ServiceEndpoints", "StreamingLoad"]


class ServiceEndpoints:
    def __init__(self, api: client.ApiClient, namespace: str, service: str, port_name: str = "http") -> None:
        self.discovery = client.DiscoveryV1Api(api)
        self.namespace = namespace
        self.service = service
        self.port_name = port_name
        self._counter: Iterator[int] = itertools.count()

    def ready(self) -> list[str]:
        """`ip:port` of every ready endpoint, sorted."""
        slices = self.discovery.list_namespaced_endpoint_slice(
            self.namespace, label_selector=f"kubernetes.io/service-name={self.service}"
        ).items
        out: list[str] = []
        for item in slices:
            ports = [p.port for p in item.ports or [] if p.name == self.port_name]
            if not ports:
                continue
            for endpoint in item.endpoints or []:
                if endpoint.conditions is None or endpoint.conditions.ready is not False:
                    out.extend(f"{address}:{ports[0]}" for address in endpoint.addresses)
        return sorted(out)

    def base_url(self) -> str:
        """`http://ip:port` of the next ready endpoint (raises if there is none)."""
        ready = self.ready()
        if not ready:
            raise ConnectionError(f"service {self.namespace}/{self.service} has no ready endpoint")
        return f"http://{ready[next(self._counter) % len(ready)]}"


@dataclass
class LoadReport:
    sent: int = 0
    completed: int = 0
    failed: list[str] = field(default_factory=list)
    truncated: list[str] = field(default_factory=list)
    endpoints: set[str] = field(default_factory=set)
    completed_by: dict[str, int] = field(default_factory=dict)  # base URL -> streams completed there


class StreamingLoad:
    """`clients` threads that each stream completions back to back from the Service's ready endpoints until
    `stop()`: a stream counts as completed only if it ends with a finish reason and `data: [DONE]`. Bounded:
    every stream has `max_tokens` and a timeout; the loop ends at `stop()` or after `max_seconds`."""

    def __init__(
        self,
        endpoints: ServiceEndpoints,
        clients: int = 8,
        max_tokens: int = 32,
        prompt: str = "Speculative decoding",
        max_seconds: float = 600.0,
    ) -> None:
        self.endpoints = endpoints
        self.clients = clients
        self.body = {"model": "target", "prompt": prompt, "max_tokens": max_tokens, "stream": True}
        self.deadline = time.monotonic() + max_seconds
        self.report = LoadReport()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def start(self) -> StreamingLoad:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> LoadReport:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=120)
        return self.report

    def _one(self, client: httpx.Client) -> None:
        try:
            base = self.endpoints.base_url()
        except Exception as err:  # no ready endpoint: the client would see a connection error
            with self._lock:
                self.report.sent += 1
                self.report.failed.append(f"no endpoint: {err}")
            return
        finish, done, error = None, False, None
        try:
            with client.stream("POST", f"{base}/v1/completions", json=self.body, timeout=120) as resp:
                if resp.status_code != 200:
                    error = f"{base}: HTTP {resp.status_code} {resp.read()[:200]!r}"
                else:
                    for line in resp.iter_lines():
                        if line == "data: [DONE]":
                            done = True
                        elif line.startswith("data: "):
                            choice = json.loads(line[6:])["choices"][0]
                            finish = choice.get("finish_reason") or finish
        except httpx.HTTPError as err:
            error = f"{base}: {type(err).__name__}: {err}"
        with self._lock:
            self.report.sent += 1
            self.report.endpoints.add(base)
            if error is not None:
                self.report.failed.append(error)
            elif not (done and finish in ("length", "stop")):
                self.report.truncated.append(f"{base}: finish={finish} done={done}")
            else:
                self.report.completed += 1
                self.report.completed_by[base] = self.report.completed_by.get(base, 0) + 1

    def completed_on(self, endpoints: list[str]) -> int:
        """The fewest streams completed on any of `endpoints` (`ip:port`, as ServiceEndpoints.ready gives)."""
        with self._lock:
            return min((self.report.completed_by.get(f"http://{e}", 0) for e in endpoints), default=0)

    def _client(self) -> None:
        with httpx.Client() as client:
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                self._one(client)
