"""A Service as the local cluster's pods reach it. There is no cluster DNS and no kube-proxy here, so a pod
cannot reach `<service>.<namespace>.svc`; a `ServiceGateway` listens on this machine's side of the pods' links
(`podnet.GATEWAY`, which every pod has a route to) and passes each connection to a ready endpoint of the
Service, round robin over its EndpointSlices as `serviceload.ServiceEndpoints` reads them. A pod names it by
`url` (an address of its own, not the Service's DNS name: a known difference from a real cluster)."""

from __future__ import annotations

import contextlib
import socket
import threading

from kubernetes import client

from specdeploy_localcluster.podnet import GATEWAY
from specdeploy_localcluster.serviceload import ServiceEndpoints

__all__ = ["ServiceGateway"]


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while chunk := src.recv(65536):
            dst.sendall(chunk)
    except OSError:
        pass
    finally:
        for end in (src, dst):
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)


class ServiceGateway:
    """`with ServiceGateway(api, namespace, service) as gateway:` pods reach the Service at `gateway.url`
    (`http://GATEWAY:<port>`) while the block runs. Needs a pod of the local cluster running (its link holds
    `GATEWAY` on this machine)."""

    def __init__(self, api: client.ApiClient, namespace: str, service: str) -> None:
        self.endpoints = ServiceEndpoints(api, namespace, service)
        self._listener = socket.socket()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{GATEWAY}:{self._listener.getsockname()[1]}"

    def __enter__(self) -> ServiceGateway:
        self._listener.bind((GATEWAY, 0))
        self._listener.listen(64)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            try:
                host, port = self.endpoints.base_url().removeprefix("http://").rsplit(":", 1)
                upstream = socket.create_connection((host, int(port)), timeout=30)
            except OSError:  # no ready endpoint, or it refused: the pod sees a closed connection
                conn.close()
                continue
            upstream.settimeout(None)
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()
