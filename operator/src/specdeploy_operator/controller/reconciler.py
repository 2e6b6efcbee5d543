"""The reconciler: the work queue, and the implementation of the cluster port (`port.py`) that reconciles
(`deployments.py`, `enginebuilds.py`) observe and apply through; the only code that talks to the API server.
Handlers only enqueue keys; everything is level-triggered and decided from live state, so a restart, a missed
event or another actor's edit converges to the same state, and deterministic names make every write
idempotent. Applies are server-side (field manager `specdeploy`) and made only where the live object lacks
a rendered field; a status is written only when it changes.

The only memory of its own the operator keeps is read-your-writes: kopf's index shows an object one watch
event after the operator wrote it, and until then the object the write returned stands in for it (so a second
reconcile in between does not write the same thing again). It is keyed by the resourceVersion the write was
made against and expires after `OWN_WRITE_TTL`; it never hides a change made by anyone else.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from specdeploy_operator.builders import OperatorSettings

from . import metrics
from .canarywindows import CanaryWindows
from .conditions import ConditionSpec
from .deployments import ReconcileFailed, reconcile_deployment
from .enginebuilds import reconcile_engine
from .engineusers import EngineNames, engines_used
from .events import Event
from .indexes import INDEX_IDS, INDEX_OF_KIND, Obj, every, one, owner_names, resource_version
from .kube import ApiError, Kube, ObjectRef, ref_of
from .livestate import difference, first_difference, merge_patch
from .port import Child, Key, wire
from .queue import WorkQueue
from .speculation import (
    CANARY_PREFIX,
    SpeculationSampler,
    close_metrics_session,
    fetch_metrics,
    speculation_targets,
)
from .trainingrouting import TrainingRouting
from .trainings import reconcile_training

__all__ = [
    "INDEX_IDS",
    "INDEX_OF_KIND",
    "Key",
    "Reconciler",
    "engines_used",
    "merge_patch",
    "owner_names",
]

log = logging.getLogger(__name__)

OWN_WRITE_TTL: Final = 30.0
"""How long an object this process wrote stands in for the index's older copy, at most."""
RETRY_CEILING_SECONDS: Final = 60.0
"""The longest a failing key waits before its next retry (controller-runtime's default is 1000 s). What
fixes a refused write (a Role granted, a quota raised) is seldom a watch event the operator sees, so the
retry itself finds out: within a minute, at one refused request per minute per object at worst."""
TERMINATING_PAUSE_SECONDS: Final = 10.0
"""After a create refused because its namespace is terminating, reconciles of anything in that namespace wait
this long after the last refusal, then run (deferred, not dropped: a namespace of the same name created afresh
is reconciled then). Its children vanishing one by one would otherwise each trigger a refused create."""


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True, slots=True)
class OwnWrite:
    """An object as this process wrote it, against the live version `against`."""

    against: str | None
    result: Obj
    at: float


class Reconciler(TrainingRouting):
    """Owns the work queue and implements the cluster port (`port.ClusterPort`): reads kopf's indexes (bound
    on the first handler call, when kopf has filled them) and writes through `Kube`."""

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
        self.queue: WorkQueue[Key] = WorkQueue(
            self._process,
            workers=workers,
            max_backoff=RETRY_CEILING_SECONDS,
            expected=(ReconcileFailed,),
        )
        self.indices: Mapping[str, Any] = {}
        self.engine_names = EngineNames(settings)
        self._resync: asyncio.TimerHandle | None = None
        self._own_writes: dict[tuple[str, str, str, str], OwnWrite] = {}
        self._terminating: dict[str, float] = {}  # namespace -> when a create there was last refused
        self._engines_of: dict[tuple[str, str], set[str]] = {}  # deployment -> engines its last event used
        # ScaledObjects have no index (KEDA may not be installed, and kopf cannot watch a resource that does
        # not exist): (namespace, name) -> the spec this process applied; cleared by the periodic resync, so
        # a hand-edited or deleted ScaledObject is repaired within `resync_seconds`.
        self.scaled_objects: dict[tuple[str, str], Obj] = {}
        self.speculation = SpeculationSampler(fetch_metrics, clock)
        self.canaries = CanaryWindows()
        self._sampling: asyncio.Task[None] | None = None

    # -- lifecycle -------------------------------------------------------------------------------------
    def bind(self, kwargs: Mapping[str, Any]) -> None:
        """Take kopf's indexes from a handler's kwargs and start the workers (once)."""
        if self.queue.started:
            return
        self.indices = {name: kwargs[name] for name in INDEX_IDS}
        self.queue.start()
        self._schedule_resync()
        if self.settings.speculation_interval_seconds > 0:
            self._sampling = asyncio.get_running_loop().create_task(self._sample_speculation())

    async def stop(self) -> None:
        if self._resync is not None:
            self._resync.cancel()
        if self._sampling is not None:
            self._sampling.cancel()
            await close_metrics_session()
        await self.queue.stop()
        await self.kube.close()

    def _schedule_resync(self) -> None:
        self._resync = asyncio.get_running_loop().call_later(self.settings.resync_seconds, self._resync_all)

    def _resync_all(self) -> None:
        """Periodic safety net: look at everything again (no request when nothing changed, but one apply per
        ScaledObject, which has no index to compare with). Own writes past their TTL go (those of objects
        deleted since are never looked up again)."""
        self.scaled_objects.clear()
        now = time.monotonic()
        for key in [key for key, write in self._own_writes.items() if now - write.at >= OWN_WRITE_TTL]:
            del self._own_writes[key]
        for namespace, name in list(self.indices["sdeps"]):
            self.queue.add(("sdep", namespace, name))
        for namespace, name in list(self.indices["enginebuilds"]):
            self.queue.add(("engine", namespace, name))
        for namespace, name in list(self.indices["drafttrainings"]):
            self.queue.add(("training", namespace, name))
        self._schedule_resync()

    async def _sample_speculation(self) -> None:
        """Every interval: scrape the ready serving pods and reconcile the deployments whose figures changed
        (speculation.py). A failure here is logged, never fatal: the figures are a report."""
        interval = self.settings.speculation_interval_seconds
        while True:
            await asyncio.sleep(interval)
            try:
                targets = speculation_targets(self.indices)
                for namespace, name in await self.speculation.sample(targets):
                    if not name.startswith(CANARY_PREFIX):
                        self.queue.add(("sdep", namespace, name))
                for namespace, name in self.canaries.add(self.speculation.last_windows, self._canary_of):
                    self.queue.add(("training", namespace, name))
                self.canaries.keep(
                    (ns, name.removeprefix(CANARY_PREFIX))
                    for ns, name in targets
                    if name.startswith(CANARY_PREFIX)
                )
            except Exception:
                log.exception("speculation sampling failed")

    # -- triggers (called by handlers) ---------------------------------------------------------------------
    def deployment_changed(self, namespace: str, name: str, body: Obj | None = None) -> None:
        """Reconcile the deployment; given its new body (its own watch event), also the EngineBuilds it no
        longer uses: garbage now, collected after the grace period rather than at the next resync."""
        self.queue.add(("sdep", namespace, name))
        self._trainings_of(namespace, name)
        if body is None:
            return
        used = self.engines_used(body)
        for engine in self._engines_of.get((namespace, name), set()) - used:
            self.queue.add(("engine", namespace, engine))
        self._engines_of[(namespace, name)] = used

    def engine_changed(self, namespace: str, name: str) -> None:
        self.queue.add(("engine", namespace, name))
        for user in self.users_of(namespace, name):
            self.queue.add(("sdep", namespace, user))

    def engines_used(self, body: Obj) -> set[str]:
        """EngineBuild names the deployment `body` uses (`engineusers`; feeds the `engine_users` index)."""
        return self.engine_names.used(body)

    def deployment_deleted(self, namespace: str, name: str, body: Obj) -> None:
        """A deleted deployment's engines may have become garbage; its replica figures go."""
        metrics.forget_deployment(namespace, name)
        self._engines_of.pop((namespace, name), None)
        for engine in self.engines_used(body):
            self.queue.add(("engine", namespace, engine))

    def users_of(self, namespace: str, engine: str) -> list[str]:
        """Deployments that use `engine` (the `engine_users` index: a lookup, not a scan)."""
        users = self.indices.get("engine_users")
        if users is None or (namespace, engine) not in users:
            return []
        return sorted({str(name) for name in users[(namespace, engine)]})

    # -- processing ----------------------------------------------------------------------------------------
    def namespace_terminating(self, namespace: str) -> None:
        """A write in `namespace` was refused because the namespace is being deleted."""
        self._terminating[namespace] = time.monotonic()

    def _terminating_pause(self, namespace: str) -> float | None:
        """Seconds reconciles in `namespace` still wait (None: they run now)."""
        refused = self._terminating.get(namespace)
        if refused is None:
            return None
        left = refused + TERMINATING_PAUSE_SECONDS - time.monotonic()
        if left <= 0:
            del self._terminating[namespace]
            return None
        return left

    async def _process(self, key: Key) -> float | None:
        kind, namespace, name = key
        pause = self._terminating_pause(namespace)
        if pause is not None:
            return pause
        started = time.perf_counter()
        try:
            if kind == "sdep":
                result = await reconcile_deployment(self, namespace, name)
            elif kind == "training":
                result = await reconcile_training(self, namespace, name)
            else:
                result = await reconcile_engine(self, namespace, name)
        except ApiError as error:
            if error.namespace_terminating:  # its objects are being deleted: nothing to build or retry now
                log.info("namespace terminating; not reconciled", extra={"key": f"{namespace}/{name}"})
                self.namespace_terminating(namespace)
                metrics.RECONCILES.labels(kind, "ok").inc()
                return None
            metrics.RECONCILES.labels(kind, "error").inc()
            raise
        except Exception:
            metrics.RECONCILES.labels(kind, "error").inc()
            raise
        finally:
            metrics.RECONCILE_SECONDS.labels(kind).observe(time.perf_counter() - started)
        metrics.RECONCILES.labels(kind, "ok").inc()
        return result

    # -- reading live state ----------------------------------------------------------------------------------
    def observe(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The live object: kopf's index copy, or this process's own newer write while the index lags."""
        live = one(self.indices.get(INDEX_OF_KIND[kind]), (namespace, name))
        key = ("object", kind, namespace, name)
        write = self._own_writes.get(key)
        if write is None:
            return live
        if time.monotonic() - write.at < OWN_WRITE_TTL and resource_version(live) == write.against:
            return write.result
        del self._own_writes[key]
        return live

    def now(self) -> datetime:
        return self.clock()

    def pods(self, namespace: str, owner: Literal["serving", "job"], name: str) -> list[Obj]:
        """Serving pods by deployment, build pods by Job (the `pods` index)."""
        return every(self.indices.get("pods"), (namespace, owner, name))

    def speculation_figures(self, namespace: str, name: str) -> tuple[Obj | None, ConditionSpec | None]:
        key = (namespace, name)
        low = self.settings.low_acceptance_rate
        return self.speculation.published(key), self.speculation.condition(key, low)

    async def events_about(self, namespace: str, kind: str, name: str) -> Sequence[Obj]:
        return await self.kube.events_about(namespace, kind, name)

    # -- writing -------------------------------------------------------------------------------------------
    def enqueue(self, key: Key) -> None:
        self.queue.add(key)

    async def event(self, body: Obj, event: Event) -> None:
        await self.kube.event(body, str(event.type), str(event.reason), event.message)

    async def ensure(self, desired: Child) -> tuple[Obj, bool]:
        """Apply `desired` unless the live object already holds every field of it; (object, applied?)."""
        desired = wire(desired)
        if str(desired["kind"]) not in INDEX_OF_KIND:
            return await self._ensure_unindexed(desired)
        meta = desired["metadata"]
        kind, namespace, name = str(desired["kind"]), str(meta.get("namespace") or ""), str(meta["name"])
        live = self.observe(kind, namespace, name)
        changed = "(new)" if live is None else difference(live, desired)
        if changed is None and live is not None:
            return live, False
        try:
            result = await self._apply(desired, live, str(changed))
        except ApiError as error:
            if live is None or error.status != 422:
                raise
            # Merged with list items another manager owns, the object is invalid (two Service ports named
            # `http` after a person's `kubectl patch` of the port): replace the rendered fields instead.
            return await self._replace(desired, live, str(changed)), True
        left = difference(result, desired)
        if left is not None:
            # Server-side apply keeps list items another manager owns next to ours (lists keyed by name or
            # port): replace the rendered fields, so what is left is exactly what is rendered.
            result = await self._replace(desired, live, left)
        return result, True

    async def _ensure_unindexed(self, desired: Mapping[str, Any]) -> tuple[Obj, bool]:
        """A kind without an index (ScaledObject): compared with what this process applied last (forgotten at
        each resync, so another actor's change is repaired within `resync_seconds`)."""
        meta = desired["metadata"]
        key = (str(meta.get("namespace") or ""), str(meta["name"]))
        memo = self.scaled_objects.get(key)
        if memo is not None and first_difference(memo, desired["spec"]) is None:
            return desired, False
        result = await self.kube.apply(desired)
        self.scaled_objects[key] = desired["spec"]
        return result, True

    async def create_if_absent(self, desired: Child) -> tuple[Obj, bool]:
        """Apply `desired` only when no such object exists: for objects whose spec is immutable and shared
        (EngineBuilds) or that may be a user's (the default cache claim)."""
        desired = wire(desired)
        meta = desired["metadata"]
        live = self.observe(str(desired["kind"]), str(meta.get("namespace") or ""), str(meta["name"]))
        if live is not None:
            return live, False
        return await self._apply(desired, None, "(new)"), True

    async def _apply(self, desired: Mapping[str, Any], live: Obj | None, changed: str) -> Obj:
        meta = desired["metadata"]
        key = ("object", str(desired["kind"]), str(meta.get("namespace") or ""), str(meta["name"]))
        against = resource_version(live)
        # Recorded before the request: deployments that share a new EngineBuild (or the default claim) are
        # reconciled concurrently, and only the first of them needs to apply it.
        self._own_writes[key] = OwnWrite(against, desired, time.monotonic())
        metrics.APPLIES.labels(desired["kind"]).inc()
        try:
            result = await self.kube.apply(desired)
        except BaseException:
            self._own_writes.pop(key, None)
            raise
        self._own_writes[key] = OwnWrite(against, result, time.monotonic())
        log.info(
            "applied" if live is None else "applied (live object differed)",
            extra={"object": str(ref_of(desired)), "field": changed},
        )
        return result

    async def _replace(self, desired: Mapping[str, Any], live: Obj | None, changed: str) -> Obj:
        """Merge-patch the rendered top-level fields (`spec`, `data`) onto the object: a merge patch replaces
        lists whole, so list items of other managers go."""
        meta = desired["metadata"]
        key = ("object", str(desired["kind"]), str(meta.get("namespace") or ""), str(meta["name"]))
        body = {k: v for k, v in desired.items() if k not in ("apiVersion", "kind", "metadata", "status")}
        metrics.APPLIES.labels(desired["kind"]).inc()
        result = await self.kube.patch(ref_of(desired), body)
        self._own_writes[key] = OwnWrite(resource_version(live), result, time.monotonic())
        log.info(
            "replaced fields another manager held", extra={"object": str(ref_of(desired)), "field": changed}
        )
        return result

    async def patch(self, ref: ObjectRef, fields: Mapping[str, Any]) -> Obj:
        """Merge-patch `fields` of `ref`; the result stands in for the live object until the index has it."""
        live = self.observe(ref.kind, ref.namespace, ref.name)
        result = await self.kube.patch(ref, fields)
        key = ("object", ref.kind, ref.namespace, ref.name)
        self._own_writes[key] = OwnWrite(resource_version(live), result, time.monotonic())
        return result

    async def delete(self, ref: ObjectRef, uid: str | None = None) -> None:
        """Delete `ref`; one that is already gone is fine."""
        if ref.kind not in INDEX_OF_KIND:
            self.scaled_objects.pop((ref.namespace, ref.name), None)
        try:
            await self.kube.delete(ref, uid=uid)
        except ApiError as error:
            if error.status not in (404, 409):
                raise
            return
        log.info("deleted", extra={"object": str(ref)})

    async def write_status(self, body: Obj, status: dict[str, Any]) -> Obj | None:
        """Write `status` if it differs from the live one (or from our own write the index has not caught up
        with); the status it replaced when written, else None."""
        meta = body["metadata"]
        key = ("status", str(body["kind"]), str(meta["namespace"]), str(meta["name"]))
        previous: Obj = body.get("status") or {}
        last = previous
        write = self._own_writes.get(key)
        if write is not None:
            fresh = time.monotonic() - write.at < OWN_WRITE_TTL
            if fresh and write.against == meta.get("resourceVersion"):
                last = write.result
            else:
                del self._own_writes[key]
        if status == last:
            return None
        ref = ObjectRef(body["apiVersion"], body["kind"], meta["namespace"], meta["name"])
        # Merge patch (RFC 7386): fields that disappeared, at any depth, are nulled; lists are replaced whole.
        patch = merge_patch({**previous, **last}, status)
        metrics.STATUS_WRITES.labels(body["kind"]).inc()
        try:
            await self.kube.patch(ref, {"status": patch}, subresource="status")
        except ApiError as error:
            if error.status == 404:  # deleted meanwhile
                return None
            raise
        self._own_writes[key] = OwnWrite(meta.get("resourceVersion"), status, time.monotonic())
        log.info(
            "status written",
            extra={
                "object": str(ref),
                "phase": status.get("phase"),
                "changed": ",".join(sorted(k for k in {**last, **status} if last.get(k) != status.get(k))),
            },
        )
        return last
