"""Reaching a Service the way kube-proxy would, without kube-proxy: every new connection goes to one of the
Service's *ready* endpoints as its EndpointSlices list them at that moment (round robin), never to the
ClusterIP (which would be traffic to an address off this machine). No retries: a failure is the test's.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from kubernetes import client

__all__ = ["ServiceEndpoints"]


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
