"""A thin asynchronous Kubernetes client: server-side apply, status and merge patches, deletes and events.

Reads (list/watch) are kopf's: the controller works from kopf's in-memory indexes and only writes here.
Every request is counted (`specdeploy_operator_api_requests_total`), which is how the benchmark and the
steady-state test see what the operator costs the API server.
"""

from __future__ import annotations

import json
import logging
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final

import aiohttp
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from specdeploy_operator.builders import FIELD_MANAGER

from . import failpoints, metrics

__all__ = ["ApiError", "Kube", "ObjectRef", "ref_of"]

log = logging.getLogger(__name__)

# (apiVersion, kind) -> plural of every kind the operator writes. All of them are namespaced.
PLURALS: Final[Mapping[tuple[str, str], str]] = {
    ("specdeploy.dev/v1alpha1", "SpeculativeDeployment"): "speculativedeployments",
    ("specdeploy.dev/v1alpha1", "EngineBuild"): "enginebuilds",
    ("specdeploy.dev/v1alpha1", "DraftTraining"): "drafttrainings",
    ("batch/v1", "Job"): "jobs",
    ("apps/v1", "Deployment"): "deployments",
    ("v1", "ConfigMap"): "configmaps",
    ("v1", "Service"): "services",
    ("v1", "PersistentVolumeClaim"): "persistentvolumeclaims",
    ("v1", "Event"): "events",
    ("policy/v1", "PodDisruptionBudget"): "poddisruptionbudgets",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "horizontalpodautoscalers",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobjects",
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkersets",
}


RBAC_DENIAL: Final = re.compile(r'cannot [a-z]+ resource "')
"""How the API server's authorizer words a denial (k8s.io/apiserver's forbidden message)."""


@dataclass(frozen=True, slots=True)
class ObjectRef:
    """Which object: apiVersion, kind, namespace, name."""

    api_version: str
    kind: str
    namespace: str
    name: str

    def path(self, subresource: str | None = None) -> str:
        plural = PLURALS[(self.api_version, self.kind)]
        prefix = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        path = f"{prefix}/namespaces/{self.namespace}/{plural}/{self.name}"
        return f"{path}/{subresource}" if subresource else path

    def __str__(self) -> str:
        return f"{self.kind} {self.namespace}/{self.name}"


def ref_of(obj: Mapping[str, Any]) -> ObjectRef:
    """The reference of an object dict."""
    meta = obj["metadata"]
    return ObjectRef(obj["apiVersion"], obj["kind"], meta.get("namespace") or "", meta["name"])


class ApiError(Exception):
    """A request the API server refused; `status` is the HTTP status."""

    def __init__(self, method: str, path: str, status: int, body: str) -> None:
        self.status = status
        self.body = body
        try:
            self.reason = str(json.loads(body).get("message", body))
        except ValueError:
            self.reason = body
        super().__init__(f"{method} {path}: {status} {self.reason}")

    @property
    def causes(self) -> frozenset[str]:
        """The `details.causes[].reason` of the API server's Status (e.g. `NamespaceTerminating`)."""
        try:
            details = json.loads(self.body).get("details") or {}
        except (ValueError, AttributeError):
            return frozenset()
        return frozenset(str(c.get("reason")) for c in details.get("causes") or () if isinstance(c, dict))

    @property
    def rbac_denied(self) -> bool:
        """Refused by authorization (`User "..." cannot patch resource "services" ...`), not by admission (a
        quota, a terminating namespace), which answers 403 as well."""
        return self.status == 403 and RBAC_DENIAL.search(self.reason) is not None

    @property
    def namespace_terminating(self) -> bool:
        """A create refused because the namespace is being deleted: nothing to do, its objects are going."""
        return self.status == 403 and "NamespaceTerminating" in self.causes


class Kube:
    """Write access to the API server, authenticated like kubectl (kubeconfig) or as the pod's service
    account (in cluster)."""

    def __init__(
        self, configuration: k8s_client.Configuration, user_agent: str = "specdeploy-operator"
    ) -> None:
        self._config = configuration
        self._user_agent = user_agent
        self._session: aiohttp.ClientSession | None = None

    @classmethod
    def from_environment(cls, kubeconfig: str | None = None) -> Kube:
        """From `kubeconfig` (or `$KUBECONFIG`, `~/.kube/config`), or the in-cluster service account."""
        configuration = k8s_client.Configuration()
        if kubeconfig is None:
            try:
                k8s_config.load_incluster_config(client_configuration=configuration)
                return cls(configuration)
            except k8s_config.ConfigException:
                pass
        k8s_config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        return cls(configuration)

    def _ssl_context(self) -> ssl.SSLContext:
        cfg = self._config
        context = (
            ssl.create_default_context(cafile=cfg.ssl_ca_cert)
            if cfg.verify_ssl
            else ssl._create_unverified_context()
        )
        if cfg.cert_file and cfg.key_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file)
        return context

    def _headers(self, content_type: str | None) -> dict[str, str]:
        headers = {"Accept": "application/json", "User-Agent": self._user_agent}
        token = self._config.get_api_key_with_prefix("BearerToken") or self._config.get_api_key_with_prefix(
            "authorization"
        )
        if token:
            headers["Authorization"] = token
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str] | None = None,
        content_type: str | None = None,
        resource: str = "",
    ) -> dict[str, Any]:
        """One request; JSON in, JSON out. Raises `ApiError` for any non-2xx answer."""
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl_context(), limit=16)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=aiohttp.ClientTimeout(total=60)
            )
        data = None if body is None else json.dumps(body)
        url = self._config.host.rstrip("/") + path
        point = f"{method} {resource}"
        failpoints.hit(f"before:{point}")
        async with self._session.request(
            method, url, data=data, params=query, headers=self._headers(content_type)
        ) as response:
            text = await response.text()
            metrics.API_REQUESTS.labels(method, resource, str(response.status)).inc()
            if response.status >= 300:
                raise ApiError(method, path, response.status, text)
        failpoints.hit(f"after:{point}")
        return json.loads(text) if text else {}

    async def apply(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        """Server-side apply of `obj` with field manager `specdeploy`, forcing conflicts (the operator owns
        the fields it renders). Strict field validation: a field the served schema does not know (say, of a
        newer KEDA) is refused, not silently dropped."""
        ref = ref_of(obj)
        return await self.request(
            "PATCH",
            ref.path(),
            body=obj,
            query={"fieldManager": FIELD_MANAGER, "force": "true", "fieldValidation": "Strict"},
            content_type="application/apply-patch+yaml",
            resource=PLURALS[(ref.api_version, ref.kind)],
        )

    async def patch(
        self, ref: ObjectRef, patch: Mapping[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        """JSON merge patch (status writes use the `status` subresource)."""
        plural = PLURALS[(ref.api_version, ref.kind)]
        return await self.request(
            "PATCH",
            ref.path(subresource),
            body=patch,
            query={"fieldManager": FIELD_MANAGER},
            content_type="application/merge-patch+json",
            resource=f"{plural}/{subresource}" if subresource else plural,
        )

    async def delete(self, ref: ObjectRef, uid: str | None = None) -> None:
        """Delete in the background (dependents follow by owner reference); a uid precondition makes sure
        a re-created object of the same name is never deleted by mistake. Already gone is fine."""
        body: dict[str, Any] = {
            "kind": "DeleteOptions",
            "apiVersion": "v1",
            "propagationPolicy": "Background",
        }
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            await self.request(
                "DELETE",
                ref.path(),
                body=body,
                content_type="application/json",
                resource=PLURALS[(ref.api_version, ref.kind)],
            )
        except ApiError as error:
            if error.status != 404:
                raise

    async def event(self, involved: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about `involved` (shown by `kubectl describe`). Failures are logged, never
        raised: events are informational."""
        meta = involved["metadata"]
        namespace = meta.get("namespace") or "default"
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        name = f"{meta['name']}.{datetime.now(UTC).strftime('%Y%m%d%H%M%S%f')}"
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "apiVersion": involved["apiVersion"],
                "kind": involved["kind"],
                "name": meta["name"],
                "namespace": namespace,
                "uid": meta.get("uid", ""),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": "specdeploy-operator"},
            "reportingComponent": "specdeploy.dev/operator",
            "reportingInstance": "specdeploy-operator",
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.request(
                "POST",
                f"/api/v1/namespaces/{namespace}/events",
                body=event,
                content_type="application/json",
                resource="events",
            )
        except (ApiError, aiohttp.ClientError) as error:
            log.warning("event not posted", extra={"reason": reason, "error": str(error)})

    async def events_about(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
        """The core/v1 Events about one object (`involvedObject` field selector): the one read the operator
        makes outside kopf's watches, for the pod-creation failures a Job (or a LeaderWorkerSet's
        StatefulSets) reports only as events."""
        result = await self.request(
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            query={"fieldSelector": f"involvedObject.kind={kind},involvedObject.name={name}"},
            resource="events",
        )
        return list(result.get("items") or [])

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
