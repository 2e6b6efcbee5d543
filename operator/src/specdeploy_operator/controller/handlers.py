"""kopf registrations: indexes (the operator's read cache, filled from kopf's watches) and event handlers
that only enqueue keys for the reconciler. No handler calls the API or waits.

No handler needs a finalizer (no deletion handlers, no timers or daemons), so the operator being down
never blocks a delete: children go through owner references, EngineBuilds through garbage collection.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

import kopf

from specdeploy_operator.api import GROUP, VERSION
from specdeploy_operator.builders.canary import CANARY_LABEL
from specdeploy_operator.builders.common import MANAGED_BY, MANAGED_BY_LABEL

from .reconciler import Reconciler, owner_names

__all__ = ["NoEssence", "register"]

MANAGED: Final = {MANAGED_BY_LABEL: MANAGED_BY}
JOB_NAME_LABEL: Final = "job-name"
INSTANCE_LABEL: Final = "app.kubernetes.io/instance"


def _snapshot(body: Mapping[str, Any], *parts: str) -> dict[str, Any]:
    """A plain copy of the parts of `body` the reconciler reads (kopf's bodies are views), without
    `metadata.managedFields` (the server's bookkeeping of server-side apply, often the largest part of an
    object's metadata; nothing reads it). Every watch event of every indexed object is copied here."""
    raw = dict(body)
    out: dict[str, Any] = {"apiVersion": raw.get("apiVersion"), "kind": raw.get("kind")}
    for part in parts:
        if part not in raw:
            continue
        value = raw[part]
        if part == "metadata" and isinstance(value, Mapping):
            value = {k: v for k, v in value.items() if k != "managedFields"}
        out[part] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    """A deep copy of JSON-like `value` into plain dicts and lists. kopf's views resolve to the parsed JSON of
    the watch event (plain dicts, lists and scalars): those take the fast path of exact type checks."""
    kind = type(value)
    if kind is dict:
        return {k: _plain(v) for k, v in value.items()}
    if kind is list:
        return [_plain(v) for v in value]
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class NoEssence(kopf.DiffBaseStorage):
    """kopf's diff-base storage for an operator without change-detecting handlers (no `on.create`,
    `on.update`, `on.resume`, `on.field`, daemons or timers: this module registers none).

    At every watch event kopf builds the object's "essence" (a deep copy of the whole body, then pruned) and
    diffs it with the last handled one, whether or not a handler will ever read the diff; at 1 000
    deployments and their pods that copying is a tenth of the operator's CPU time. With no such handler
    nothing reads the essence, so this builds an empty one and stores none."""

    def build(
        self, *, body: kopf.Body, extra_fields: Iterable[kopf.FieldSpec] | None = None
    ) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def _reconciler(memo: Any, kwargs: Mapping[str, Any]) -> Reconciler:
    reconciler: Reconciler = memo.reconciler
    reconciler.bind(kwargs)
    return reconciler


def _key(kw: Mapping[str, Any]) -> tuple[str, str]:
    return (str(kw["namespace"]), str(kw["name"]))


SDEP: Final = (GROUP, VERSION, "speculativedeployments")
ENGINE: Final = (GROUP, VERSION, "enginebuilds")
TRAINING: Final = (GROUP, VERSION, "drafttrainings")
LWS: Final = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")


def register_indexes(registry: kopf.OperatorRegistry) -> None:
    """The reconciler's read cache: one kopf index per kind it reads (`indexes.INDEX_IDS`)."""
    sdep, engine = SDEP, ENGINE

    def by_name(id_: str, group: str, version: str, plural: str, *parts: str, managed: bool = True) -> None:
        labels = MANAGED if managed else None

        @kopf.index(group, version, plural, id=id_, labels=labels, registry=registry)
        async def index(**kw: Any) -> dict[Any, Any]:
            return {_key(kw): _snapshot(kw["body"], *parts)}

    # The content of every owned object is indexed (not only its metadata): the reconciler compares it with
    # what it renders, so another actor's change is seen and reverted on its watch event.
    by_name("sdeps", *sdep, "metadata", "spec", "status", managed=False)
    by_name("enginebuilds", *engine, "metadata", "spec", "status", managed=False)
    by_name("drafttrainings", *TRAINING, "metadata", "spec", "status", managed=False)
    for id_, resource, parts in (
        ("jobs", ("batch", "v1", "jobs"), ("metadata", "status")),
        ("deployments", ("apps", "v1", "deployments"), ("metadata", "spec", "status")),
        # Served only where the LeaderWorkerSet controller is installed: kopf watches it once its CRD exists.
        ("leaderworkersets", LWS, ("metadata", "spec", "status")),
        ("configmaps", ("", "v1", "configmaps"), ("metadata", "data")),
        ("services", ("", "v1", "services"), ("metadata", "spec")),
        ("pdbs", ("policy", "v1", "poddisruptionbudgets"), ("metadata", "spec")),
        ("hpas", ("autoscaling", "v2", "horizontalpodautoscalers"), ("metadata", "spec", "status")),
    ):
        by_name(id_, *resource, *parts)
    # Every claim, not only ours: a user's claim named like the default one must not be overwritten; with its
    # status, which says whether it is bound and with which access modes (condition EngineCacheReady).
    by_name("pvcs", "", "v1", "persistentvolumeclaims", "metadata", "spec", "status", managed=False)

    @kopf.index(*sdep, id="engine_users", registry=registry)
    async def engine_users(**kw: Any) -> dict[Any, Any]:
        """EngineBuild -> the deployments that use it (garbage collection and EngineBuild events look a
        deployment up here instead of scanning them all)."""
        namespace, name = _key(kw)
        reconciler: Reconciler = kw["memo"].reconciler
        used = reconciler.engines_used(dict(kw["body"]))  # reads the event's parsed JSON, keeps nothing
        return {(namespace, engine): name for engine in used}

    @kopf.index("", "v1", "pods", id="pods", labels=MANAGED, registry=registry)
    async def pods(**kw: Any) -> dict[Any, Any]:
        """Build pods by Job, serving pods by deployment."""
        labels: Mapping[str, str] = kw["labels"]
        namespace = str(kw["namespace"])
        if JOB_NAME_LABEL in labels:
            key = (namespace, "job", labels[JOB_NAME_LABEL])
        elif CANARY_LABEL in labels:  # a DraftTraining's canary: not one of the deployment's replicas
            key = (namespace, "canary", labels[CANARY_LABEL])
        elif INSTANCE_LABEL in labels:
            key = (namespace, "serving", labels[INSTANCE_LABEL])
        else:
            return {}
        return {key: _snapshot(kw["body"], "metadata", "status")}


def register(registry: kopf.OperatorRegistry) -> None:
    """Register every index and handler of the operator in `registry`. Handlers take `**kw` (kopf passes
    everything by keyword) and read what they need."""
    sdep, engine = SDEP, ENGINE
    register_indexes(registry)

    # -- events -> work queue -------------------------------------------------------------------------
    @kopf.on.event(*sdep, registry=registry)
    async def on_deployment(**kw: Any) -> None:
        reconciler = _reconciler(kw["memo"], kw)
        namespace, name = _key(kw)
        if kw["type"] == "DELETED":
            body = _snapshot(kw["body"], "metadata", "spec", "status")
            reconciler.deployment_deleted(namespace, name, body)
        else:  # the engines it uses are read from the event's parsed JSON; nothing of it is kept
            reconciler.deployment_changed(namespace, name, dict(kw["body"]))

    @kopf.on.event(*engine, registry=registry)
    async def on_engine(**kw: Any) -> None:
        _reconciler(kw["memo"], kw).engine_changed(*_key(kw))

    @kopf.on.event(*TRAINING, registry=registry)
    async def on_training(**kw: Any) -> None:
        _reconciler(kw["memo"], kw).training_changed(*_key(kw))

    def job_changed(reconciler: Reconciler, namespace: str, job: Mapping[str, Any]) -> None:
        for owner in owner_names(job, "EngineBuild"):
            reconciler.engine_changed(namespace, owner)
        for owner in owner_names(job, "DraftTraining"):
            reconciler.training_changed(namespace, owner)

    @kopf.on.event("batch", "v1", "jobs", labels=MANAGED, registry=registry)
    async def on_job(**kw: Any) -> None:
        job_changed(_reconciler(kw["memo"], kw), str(kw["namespace"]), kw["body"])

    @kopf.on.event("", "v1", "pods", labels=MANAGED, registry=registry)
    async def on_pod(**kw: Any) -> None:
        reconciler = _reconciler(kw["memo"], kw)
        labels: Mapping[str, str] = kw["labels"]
        namespace = str(kw["namespace"])
        if JOB_NAME_LABEL in labels:
            for job in kw["jobs"].get((namespace, labels[JOB_NAME_LABEL]), ()):
                job_changed(reconciler, namespace, job)
        elif CANARY_LABEL in labels:
            reconciler.training_changed(namespace, labels[CANARY_LABEL])
        elif INSTANCE_LABEL in labels:
            reconciler.deployment_changed(namespace, labels[INSTANCE_LABEL])

    def owned_child(group: str, version: str, plural: str) -> None:
        @kopf.on.event(group, version, plural, labels=MANAGED, id=f"on_{plural}", registry=registry)
        async def on_child(**kw: Any) -> None:
            reconciler = _reconciler(kw["memo"], kw)
            for owner in owner_names(kw["body"], "SpeculativeDeployment"):
                reconciler.deployment_changed(str(kw["namespace"]), owner)
            for owner in owner_names(kw["body"], "DraftTraining"):  # a canary's Deployment or ConfigMap
                reconciler.training_changed(str(kw["namespace"]), owner)

    for group, version, plural in (
        ("apps", "v1", "deployments"),
        LWS,
        ("", "v1", "configmaps"),
        ("", "v1", "services"),
        ("policy", "v1", "poddisruptionbudgets"),
        ("", "v1", "persistentvolumeclaims"),
        ("autoscaling", "v2", "horizontalpodautoscalers"),
    ):
        owned_child(group, version, plural)

    @kopf.on.cleanup(registry=registry)
    async def stop(**kw: Any) -> None:
        await kw["memo"].reconciler.stop()
