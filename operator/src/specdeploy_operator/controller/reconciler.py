"""Reconciliation: observe (kopf's indexes) -> build desired (pure builders) -> apply what differs
(server-side apply, field manager `specdeploy`) -> write status only when it changes.

Two kinds of keys go through one work queue: `("sdep", namespace, name)` for SpeculativeDeployments and
`("engine", namespace, name)` for EngineBuilds. Handlers only enqueue; everything here is level-triggered, so
a restart (or a missed event) converges to the same state, and deterministic names make every write
idempotent: a retry never creates a second Job or Deployment.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import ValidationError

from specdeploy_operator.api import API_VERSION, SpeculativeDeployment
from specdeploy_operator.builders import (
    METRIC_NAMES,
    OperatorSettings,
    build_autoscaler,
    build_cache_pvc,
    build_configmap,
    build_default_cache_pvc,
    build_deployment,
    build_engine_builds,
    build_job,
    build_pdb,
    build_service,
    cache_pvc_name,
    endpoint,
    job_name,
    quantity,
    status_selector,
)
from specdeploy_operator.builders.autoscaling import KEDA_API_VERSION

from . import metrics
from .kube import ApiError, Kube, ObjectRef, ref_of
from .podcreation import creation_event, job_creation_problem, job_events_needed
from .queue import WorkQueue
from .status import (
    ConditionSpec,
    EngineObservation,
    ServingObservation,
    deployment_status,
    engine_build_status,
    hpa_report,
    merge_conditions,
    rfc3339,
)

__all__ = [
    "APPLIED_HASH_ANNOTATION",
    "INDEX_IDS",
    "UNREFERENCED_ANNOTATION",
    "Key",
    "Reconciler",
    "merge_patch",
]

log = logging.getLogger(__name__)

APPLIED_HASH_ANNOTATION: Final = "specdeploy.dev/applied-hash"
"""Hash of the object as the operator last rendered it: equal hash, nothing to apply."""
UNREFERENCED_ANNOTATION: Final = "specdeploy.dev/unreferenced-since"
"""When an EngineBuild stopped being used by any deployment (garbage collection after the grace period)."""
RECENT_WRITE_TTL: Final = 30.0
AUTOSCALER_RETRY_SECONDS: Final = 60.0
JOB_EVENTS_RETRY_SECONDS: Final = 5.0
"""How soon a build Job without a pod is looked at again (its events say whether pods cannot be created)."""
"""How soon a ScaledObject that could not be created (KEDA not installed) is tried again."""

Key = tuple[Literal["sdep", "engine"], str, str]
Obj = Mapping[str, Any]

INDEX_IDS: Final = (
    "sdeps",
    "enginebuilds",
    "jobs",
    "pods",
    "deployments",
    "configmaps",
    "services",
    "pdbs",
    "pvcs",
    "hpas",
)
"""The kopf indexes the reconciler reads (registered in `handlers`)."""


def _now() -> datetime:
    return datetime.now(UTC)


def _one(index: Any, key: object) -> Obj | None:
    if index is None or key not in index:
        return None
    for value in index[key]:
        return dict(value)
    return None


def _all(index: Any, key: object) -> list[Obj]:
    if index is None or key not in index:
        return []
    return [dict(value) for value in index[key]]


def applied_hash(obj: Obj) -> str:
    """Hash of a rendered object (before the hash annotation is added)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def with_applied_hash(obj: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` with `metadata.annotations[specdeploy.dev/applied-hash]` set."""
    digest = applied_hash(obj)
    out = dict(obj)
    meta = dict(out["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), APPLIED_HASH_ANNOTATION: digest}
    out["metadata"] = meta
    return out


def _hash_of(observed: Obj | None) -> str | None:
    if observed is None:
        return None
    return ((observed.get("metadata") or {}).get("annotations") or {}).get(APPLIED_HASH_ANNOTATION)


def engine_names_in_status(status: Obj | None) -> set[str]:
    engines = (status or {}).get("engines") or {}
    names = {
        str(ref["name"]) for role, ref in engines.items() if role != "previous" and isinstance(ref, Mapping)
    }
    names.update(str(n) for n in engines.get("previous") or ())
    return names


class Reconciler:
    """Owns the work queue; reads kopf's indexes (bound on the first handler call, when kopf has filled
    them) and writes through `Kube`."""

    def __init__(
        self,
        kube: Kube,
        settings: OperatorSettings,
        *,
        workers: int = 8,
        clock: Callable[[], datetime] = _now,
    ) -> None:
        self.kube = kube
        self.settings = settings
        self.clock = clock
        self.queue: WorkQueue[Key] = WorkQueue(self._process, workers=workers)
        self.indices: Mapping[str, Any] = {}
        # (namespace, deployment) -> EngineBuild names it currently needs (filled by its reconciliation).
        self.desired_engines: dict[tuple[str, str], set[str]] = {}
        self._resync: asyncio.TimerHandle | None = None
        # What this process wrote last, per object: (resourceVersion seen before the write, what was
        # written, when). kopf's index lags behind our own writes by one watch event; while it still shows
        # the version we wrote against, we trust the memo instead of writing the same thing again.
        self._recent: dict[tuple[str, str, str, str], tuple[str | None, Any, float]] = {}
        # ScaledObjects have no index (KEDA may not be installed, and kopf cannot watch a resource that does
        # not exist): (namespace, name) -> hash applied by this process; cleared by the periodic resync, so
        # a hand-edited or deleted ScaledObject is repaired within `resync_seconds`.
        self._scaled_objects: dict[tuple[str, str], str] = {}

    # -- lifecycle -------------------------------------------------------------------------------------
    def bind(self, kwargs: Mapping[str, Any]) -> None:
        """Take kopf's indexes from a handler's kwargs and start the workers (once)."""
        if self.queue.started:
            return
        self.indices = {name: kwargs[name] for name in INDEX_IDS}
        self.queue.start()
        self._schedule_resync()

    async def stop(self) -> None:
        if self._resync is not None:
            self._resync.cancel()
        await self.queue.stop()
        await self.kube.close()

    def _schedule_resync(self) -> None:
        loop = asyncio.get_running_loop()
        self._resync = loop.call_later(self.settings.resync_seconds, self._resync_all)

    def _resync_all(self) -> None:
        """Periodic safety net: look at everything again (costs no request when nothing changed, but one
        apply per ScaledObject, which has no index to compare with)."""
        self._scaled_objects.clear()
        for namespace, name in list(self.indices["sdeps"]):
            self.queue.add(("sdep", namespace, name))
        for namespace, name in list(self.indices["enginebuilds"]):
            self.queue.add(("engine", namespace, name))
        self._schedule_resync()

    # -- triggers (called by handlers) ---------------------------------------------------------------------
    def deployment_changed(self, namespace: str, name: str) -> None:
        self.queue.add(("sdep", namespace, name))

    def engine_changed(self, namespace: str, name: str) -> None:
        self.queue.add(("engine", namespace, name))
        for user in self.users_of(namespace, name):
            self.queue.add(("sdep", namespace, user))

    def deployment_deleted(self, namespace: str, name: str, status: Obj | None) -> None:
        """A deleted deployment's engines may have become garbage."""
        engines = self.desired_engines.pop((namespace, name), set()) | engine_names_in_status(status)
        for engine in engines:
            self.queue.add(("engine", namespace, engine))

    def users_of(self, namespace: str, engine: str) -> list[str]:
        """Deployments that need `engine` now, or keep it for rollback."""
        users: list[str] = []
        for ns, name in list(self.indices.get("sdeps") or ()):
            if ns != namespace:
                continue
            body = _one(self.indices["sdeps"], (ns, name))
            if body is None:
                continue
            if engine in self._needed(body) or engine in engine_names_in_status(body.get("status")):
                users.append(name)
        return users

    def _needed(self, body: Obj) -> set[str]:
        """EngineBuild names a deployment needs: remembered from its last reconciliation, or rendered now
        (after a restart, before its first reconciliation)."""
        key = (body["metadata"]["namespace"], body["metadata"]["name"])
        if key not in self.desired_engines:
            try:
                sdep = SpeculativeDeployment.model_validate(body)
            except ValidationError:
                return set()
            self.desired_engines[key] = {
                e["metadata"]["name"] for e in build_engine_builds(sdep, self.settings)
            }
        return self.desired_engines[key]

    # -- processing ----------------------------------------------------------------------------------------
    async def _process(self, key: Key) -> float | None:
        kind, namespace, name = key
        started = time.perf_counter()
        try:
            if kind == "sdep":
                result = await self.reconcile_deployment(namespace, name)
            else:
                result = await self.reconcile_engine(namespace, name)
        except Exception:
            metrics.RECONCILES.labels(kind, "error").inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.labels(kind).observe(time.perf_counter() - started)
        metrics.RECONCILES.labels(kind, "ok").inc()
        return result

    def _wrote_already(self, what: str, obj: Obj, observed: Obj | None, value: Any) -> bool:
        """Whether this process just wrote `value` to `obj` and the index has not caught up yet."""
        meta = obj["metadata"]
        key = (what, obj["kind"], meta.get("namespace") or "", meta["name"])
        memo = self._recent.get(key)
        if memo is None:
            return False
        version = ((observed or {}).get("metadata") or {}).get("resourceVersion")
        if memo[0] == version and memo[1] == value and time.monotonic() - memo[2] < RECENT_WRITE_TTL:
            return True
        del self._recent[key]
        return False

    def _forget(self, what: str, obj: Obj) -> None:
        meta = obj["metadata"]
        self._recent.pop((what, obj["kind"], meta.get("namespace") or "", meta["name"]), None)

    def _remember(self, what: str, obj: Obj, observed: Obj | None, value: Any) -> None:
        meta = obj["metadata"]
        key = (what, obj["kind"], meta.get("namespace") or "", meta["name"])
        version = ((observed or {}).get("metadata") or {}).get("resourceVersion")
        self._recent[key] = (version, value, time.monotonic())

    async def _ensure(self, desired: Mapping[str, Any], observed: Obj | None) -> tuple[Obj, bool]:
        """Apply `desired` unless the observed object already carries its hash; (object, applied?)."""
        rendered = with_applied_hash(desired)
        digest = rendered["metadata"]["annotations"][APPLIED_HASH_ANNOTATION]
        if observed is not None and _hash_of(observed) == digest:
            return observed, False
        if self._wrote_already("apply", rendered, observed, digest):
            return observed or rendered, False
        # Remembered before the request: deployments that share a new EngineBuild (or the default claim) are
        # reconciled concurrently, and only the first of them needs to apply it.
        self._remember("apply", rendered, observed, digest)
        metrics.APPLIES.labels(desired["kind"]).inc()
        try:
            result = await self.kube.apply(rendered)
        except BaseException:
            self._forget("apply", rendered)
            raise
        log.info("applied", extra={"object": str(ref_of(rendered)), "hash": digest})
        return result, True

    async def reconcile_deployment(self, namespace: str, name: str) -> float | None:
        body = _one(self.indices["sdeps"], (namespace, name))
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        meta = body["metadata"]
        previous_status = body.get("status") or {}
        try:
            sdep = SpeculativeDeployment.model_validate(body)
        except ValidationError as error:
            await self._write_invalid(body, error)
            return None
        now = self.clock()
        settings = self.settings

        # Engines: create the EngineBuilds that do not exist yet (shared ones are found by name).
        desired_engines = build_engine_builds(sdep, settings)
        self.desired_engines[(namespace, name)] = {e["metadata"]["name"] for e in desired_engines}
        engines: list[EngineObservation] = []
        for engine in desired_engines:
            engine_name = engine["metadata"]["name"]
            observed = _one(self.indices["enginebuilds"], (namespace, engine_name))
            if observed is None:
                observed, _ = await self._ensure(engine, None)
                self.queue.add(("engine", namespace, engine_name))
            engines.append(
                EngineObservation(engine["spec"]["role"], engine_name, engine["spec"]["hash"], observed)
            )
        engines_built = all(e.phase == "Succeeded" for e in engines)

        # The engine cache: the deployment's own claim, or the operator's shared default claim.
        own_claim = build_cache_pvc(sdep, settings)
        claim_name = cache_pvc_name(sdep, settings)
        observed_claim = _one(self.indices["pvcs"], (namespace, claim_name))
        if own_claim is not None:
            await self._ensure(own_claim, observed_claim)
        elif claim_name == settings.cache_pvc_name and observed_claim is None:
            await self._ensure(build_default_cache_pvc(namespace, settings), None)

        deployment = _one(self.indices["deployments"], (namespace, name))
        current = False
        if engines_built:
            for child in (
                build_configmap(sdep, desired_engines, settings),
                build_service(sdep),
                build_pdb(sdep),
            ):
                index = {"ConfigMap": "configmaps", "Service": "services", "PodDisruptionBudget": "pdbs"}
                observed_child = _one(
                    self.indices[index[child["kind"]]], (namespace, child["metadata"]["name"])
                )
                await self._ensure(child, observed_child)
            desired_deployment = build_deployment(sdep, desired_engines, settings)
            replicas_differ = (
                deployment is not None
                and (deployment.get("spec") or {}).get("replicas") != sdep.spec.replicas
            )
            before = _hash_of(deployment)
            result, applied = await self._ensure(desired_deployment, None if replicas_differ else deployment)
            new_hash = _hash_of(result)
            if applied and before != new_hash and self._template_changed(deployment, desired_deployment):
                await self.kube.event(
                    body,
                    "Normal",
                    "RolloutStarted",
                    f"rolling out {desired_deployment['metadata']['name']} "
                    f"({sdep.spec.replicas} replicas, {sdep.spec.gpus_per_replica} GPUs each)",
                )
            if applied:
                deployment = result
            current = self._deployment_current(deployment, new_hash)
        elif deployment is not None and (deployment.get("spec") or {}).get("replicas") != sdep.spec.replicas:
            # Engines are being rebuilt: the old pods keep serving, but a scale change applies now.
            await self.kube.patch(ref_of(deployment), {"spec": {"replicas": sdep.spec.replicas}})

        autoscaler, retry = await self._reconcile_autoscaler(body, sdep)
        pods = _all(self.indices["pods"], (namespace, "serving", name))
        status = deployment_status(
            generation=meta.get("generation"),
            desired_replicas=sdep.spec.replicas,
            engines=engines,
            serving=ServingObservation(deployment, current, pods),
            selector=status_selector(sdep),
            endpoint=endpoint(sdep),
            gpus_per_replica=sdep.spec.gpus_per_replica,
            gpu_resource=sdep.spec.placement.gpu_resource,
            autoscaler=autoscaler,
            previous=previous_status,
            keep_previous=settings.keep_previous_engines,
            now=now,
        )
        await self._write_status(body, previous_status, status)
        return retry

    async def _reconcile_autoscaler(
        self, body: Obj, sdep: SpeculativeDeployment
    ) -> tuple[dict[str, Any] | None, float | None]:
        """Create or update the autoscaler `spec.autoscaling` asks for and delete one it no longer asks for.
        Returns `status.autoscaler` and, when creating it failed, when to try again."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        desired = build_autoscaler(sdep, self.settings)
        kind = desired["kind"] if desired is not None else None
        hpa = _one(self.indices["hpas"], (namespace, name))
        if hpa is not None and kind != "HorizontalPodAutoscaler":
            await self._delete(ref_of(hpa), (hpa.get("metadata") or {}).get("uid"))
        previous = (body.get("status") or {}).get("autoscaler") or {}
        if previous.get("kind") == "ScaledObject" and kind != "ScaledObject":
            self._scaled_objects.pop((namespace, name), None)
            await self._delete(ObjectRef(KEDA_API_VERSION, "ScaledObject", namespace, str(previous["name"])))
        auto = sdep.spec.autoscaling
        if desired is None or auto is None:
            return None, None
        report: dict[str, Any] = {
            "kind": kind,
            "name": name,
            "metric": METRIC_NAMES[auto.metric],
            "target": quantity(auto.target_value),
        }
        if kind == "HorizontalPodAutoscaler":
            result, applied = await self._ensure(desired, hpa)
            report.update(hpa_report(hpa if not applied else result))
            return report, None
        digest = applied_hash(desired)
        if self._scaled_objects.get((namespace, name)) == digest:
            return report, None
        try:
            await self.kube.apply(with_applied_hash(desired))
        except ApiError as error:
            if error.status not in (403, 404):
                raise
            why = "not served by the cluster (is KEDA installed?)" if error.status == 404 else "forbidden"
            report["message"] = (
                f"ScaledObject {name} cannot be created: {KEDA_API_VERSION} ScaledObject is {why}"
            )
            if previous.get("message") != report["message"]:
                await self.kube.event(body, "Warning", "AutoscalerFailed", report["message"])
            return report, AUTOSCALER_RETRY_SECONDS
        metrics.APPLIES.labels("ScaledObject").inc()
        self._scaled_objects[(namespace, name)] = digest
        return report, None

    async def _delete(self, ref: ObjectRef, uid: str | None = None) -> None:
        """Delete `ref`; one that is already gone is fine."""
        try:
            await self.kube.delete(ref, uid=uid)
        except ApiError as error:
            if error.status not in (404, 409):
                raise
            return
        log.info("deleted", extra={"object": str(ref)})

    @staticmethod
    def _template_changed(observed: Obj | None, desired: Obj) -> bool:
        if observed is None:
            return True
        old = ((observed.get("spec") or {}).get("template") or {}).get("metadata") or {}
        new = desired["spec"]["template"]["metadata"]
        return bool((old.get("annotations") or {}) != new.get("annotations"))

    @staticmethod
    def _deployment_current(deployment: Obj | None, digest: str | None) -> bool:
        """Whether the Deployment carries the desired template and its controller has seen it."""
        if deployment is None or digest is None or _hash_of(deployment) != digest:
            return False
        generation = (deployment.get("metadata") or {}).get("generation") or 0
        observed = (deployment.get("status") or {}).get("observedGeneration") or 0
        return bool(observed >= generation)

    async def _write_invalid(self, body: Obj, error: ValidationError) -> None:
        """A spec the API server admitted but the operator's model rejects (e.g. an older CRD version):
        report it in status instead of crashing, and touch nothing else."""
        message = "; ".join(
            f"spec{''.join(f'.{p}' for p in e['loc'][1:]) if e['loc'][:1] == ('spec',) else ''}: {e['msg']}"
            for e in error.errors()
        )
        previous = body.get("status") or {}
        generation = body["metadata"].get("generation")
        status = dict(previous)
        status["phase"] = "Failed"
        status["observedGeneration"] = generation
        status["conditions"] = merge_conditions(
            previous.get("conditions"),
            [ConditionSpec("Degraded", "True", "InvalidSpec", message)],
            self.clock(),
            generation,
        )
        await self._write_status(body, previous, status)

    async def _write_status(self, body: Obj, previous: Obj, status: dict[str, Any]) -> None:
        """Write `status` if it differs from the last known one (the index's, or our own write that the
        index has not caught up with), then post the milestone events of the change."""
        meta = body["metadata"]
        key = ("status", body["kind"], meta["namespace"], meta["name"])
        memo = self._recent.get(key)
        last = previous
        if memo is not None:
            fresh = time.monotonic() - memo[2] < RECENT_WRITE_TTL
            if fresh and memo[0] == meta.get("resourceVersion"):
                last = memo[1]
            else:
                del self._recent[key]
        if status == last:
            return
        ref = ObjectRef(body["apiVersion"], body["kind"], meta["namespace"], meta["name"])
        # Merge patch (RFC 7386): fields that disappeared, at any depth, are nulled; lists are replaced whole.
        patch = merge_patch({**previous, **last}, status)
        metrics.STATUS_WRITES.labels(body["kind"]).inc()
        try:
            await self.kube.patch(ref, {"status": patch}, subresource="status")
        except ApiError as error:
            if error.status == 404:  # deleted meanwhile
                return
            raise
        self._recent[key] = (meta.get("resourceVersion"), status, time.monotonic())
        log.info(
            "status written",
            extra={
                "object": str(ref),
                "phase": status.get("phase"),
                "changed": ",".join(sorted(k for k in {**last, **status} if last.get(k) != status.get(k))),
            },
        )
        refused = creation_event(last, status)  # pods cannot be created (issue #24)
        if refused is not None:
            await self.kube.event(body, "Warning", *refused)
        await self._events_for(body, last, status)

    async def _events_for(self, body: Obj, previous: Obj, status: Obj) -> None:
        """Milestone events, posted when the phase changes, or when a Degraded deployment is degraded for
        another reason (e.g. Unschedulable -> CapacityPending)."""
        old, new = previous.get("phase"), status.get("phase")
        conditions = {c["type"]: c for c in status.get("conditions") or ()}
        old_reason = next(
            (c.get("reason") for c in previous.get("conditions") or () if c.get("type") == "Degraded"), None
        )
        if old == new and (new != "Degraded" or old_reason == conditions.get("Degraded", {}).get("reason")):
            return
        if body["kind"] == "EngineBuild":
            message = str(status.get("message") or "")
            if new == "Running":
                await self.kube.event(
                    body, "Normal", "BuildStarted", f"build Job {status.get('jobName')} is running"
                )
            elif new == "Succeeded":
                await self.kube.event(body, "Normal", "BuildSucceeded", message)
            elif new == "Failed":
                await self.kube.event(body, "Warning", "BuildFailed", message)
            return
        reasons = {
            "Building": ("Normal", "Building", conditions.get("EnginesReady", {}).get("message", "")),
            "Deploying": ("Normal", "Deploying", conditions.get("Progressing", {}).get("message", "")),
            "Ready": ("Normal", "RolloutFinished", f"ready at {status.get('endpoint')}"),
            "Failed": ("Warning", "BuildFailed", conditions.get("EnginesReady", {}).get("message", "")),
            "Degraded": (
                "Warning",
                str(conditions.get("Degraded", {}).get("reason", "Degraded")),
                str(conditions.get("Degraded", {}).get("message", "")),
            ),
        }
        if new in reasons:
            type_, reason, message = reasons[str(new)]
            await self.kube.event(body, type_, reason, str(message))

    # -- EngineBuilds --------------------------------------------------------------------------------------
    async def reconcile_engine(self, namespace: str, name: str) -> float | None:
        body = _one(self.indices["enginebuilds"], (namespace, name))
        if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
            return None
        collect_in = await self._collect_garbage(body)
        if collect_in is not None:
            return collect_in if collect_in > 0 else None
        previous = body.get("status") or {}
        if previous.get("phase") == "Succeeded":
            return None  # built; its Job may already be gone (ttlSecondsAfterFinished)
        job_key = (namespace, job_name(dict(body)))
        job = _one(self.indices["jobs"], job_key)
        created = False
        if job is None and previous.get("phase") != "Failed":
            job, created = await self._ensure(build_job(dict(body), self.settings), None)
        pods = _all(self.indices["pods"], (namespace, "job", job_key[1]))
        # -- pod creation refused (issue #24): a Job reports it only in events, and changes no field --
        creation, retry = None, None
        if job_events_needed(job, pods):
            retry = JOB_EVENTS_RETRY_SECONDS
            if not created:
                events = await self.kube.events_about(namespace, "Job", job_key[1])
                creation = job_creation_problem(job, pods, events)
        status = engine_build_status(job, pods, previous, self.clock(), creation)
        await self._write_status(body, previous, status)
        return retry

    async def _collect_garbage(self, body: Obj) -> float | None:
        """None when the EngineBuild is in use; otherwise seconds until it may be deleted (0: deleted now).
        The moment it became unused is stored on it, so a restart does not restart the grace period."""
        meta = body["metadata"]
        namespace, name = meta["namespace"], meta["name"]
        ref = ObjectRef(API_VERSION, "EngineBuild", namespace, name)
        since = (meta.get("annotations") or {}).get(UNREFERENCED_ANNOTATION)
        if self.users_of(namespace, name):
            if since is not None:
                await self.kube.patch(ref, {"metadata": {"annotations": {UNREFERENCED_ANNOTATION: None}}})
            return None
        now = self.clock()
        if since is None:
            await self.kube.patch(ref, {"metadata": {"annotations": {UNREFERENCED_ANNOTATION: rfc3339(now)}}})
            remaining = float(self.settings.gc_grace_seconds)
        else:
            try:
                began = datetime.strptime(since, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
            except ValueError:
                began = now
            remaining = self.settings.gc_grace_seconds - (now - began).total_seconds()
        if remaining > 0:
            return remaining + 0.5
        await self.kube.delete(ref, uid=meta.get("uid"))
        log.info("deleted unused EngineBuild", extra={"object": f"{namespace}/{name}"})
        return 0.0


def merge_patch(old: Obj, new: Obj) -> dict[str, Any]:
    """A JSON merge patch turning `old` into `new` where both are objects: `new` itself, with `None` for every
    key of `old` missing from `new`, recursively into objects present in both (a nested field that went away,
    say `status.autoscaler.message`, is removed, not kept by the merge)."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, Mapping) and isinstance(before, Mapping):
            patch[key] = merge_patch(before, value)
        else:
            patch[key] = value
    return patch


def owner_names(body: Obj, kind: str) -> Iterable[str]:
    """Names of the owners of `body` of kind `kind`."""
    for owner in (body.get("metadata") or {}).get("ownerReferences") or ():
        if owner.get("kind") == kind:
            yield str(owner["name"])
