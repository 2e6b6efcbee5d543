"""Requests to the local cluster's apiserver as its admin (the `admin` client certificate of its PKI): the
standard library only, so that the harness reaches its cluster before and without any Kubernetes client."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

FIELD_MANAGER = "specdeploy-localcluster"
_PLURALS = {
    "ConfigMap": "configmaps",
    "Service": "services",
    "APIService": "apiservices",
    "StorageClass": "storageclasses",
}


class AdminApi:
    """The apiserver at `server` (https://127.0.0.1:<port>), trusted and reached with the PKI in `pki`."""

    def __init__(self, server: str, pki: Path) -> None:
        self.server = server
        self.pki = pki

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki / "ca.crt"))
        ctx.load_cert_chain(str(self.pki / "admin.crt"), str(self.pki / "admin.key"))
        return ctx

    def request(
        self, method: str, path: str, body: Any = None, timeout: float = 10.0, content_type: str | None = None
    ) -> Any:
        """One request; a PATCH is a server-side apply unless `content_type` says otherwise
        (`application/merge-patch+json`). Returns the decoded JSON object, or the text of any other body."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.server + path, data=data, method=method)
        req.add_header("Accept", "application/json")
        if data is not None:
            if content_type is None:
                content_type = "application/apply-patch+yaml" if method == "PATCH" else "application/json"
            req.add_header("Content-Type", content_type)
        with urllib.request.urlopen(req, context=self._ssl(), timeout=timeout) as resp:
            raw = resp.read()
        return json.loads(raw) if raw.strip().startswith(b"{") else raw.decode()

    def ready(self) -> bool:
        """Whether the apiserver answers /readyz with ok."""
        try:
            return bool(self.request("GET", "/readyz", timeout=3) == "ok")
        except (OSError, urllib.error.URLError):
            return False

    def exists(self, path: str) -> bool:
        try:
            self.request("GET", path)
        except urllib.error.HTTPError as err:
            if err.code == 404:
                return False
            raise
        return True

    def apply(self, obj: Mapping[str, Any]) -> None:
        """Server-side apply of one object (field manager FIELD_MANAGER, forcing conflicts)."""
        api_version, kind, meta = obj["apiVersion"], obj["kind"], obj["metadata"]
        prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
        plural = _PLURALS.get(kind, kind.lower() + "s")
        namespace = f"/namespaces/{meta['namespace']}" if "namespace" in meta else ""
        path = f"{prefix}{namespace}/{plural}/{meta['name']}?fieldManager={FIELD_MANAGER}&force=true"
        self.request("PATCH", path, obj)
