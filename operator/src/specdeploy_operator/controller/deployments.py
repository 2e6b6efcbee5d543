"""Reconciling one SpeculativeDeployment: ensure its engines, ensure its serving objects, ensure its
autoscaler, report. Each step compares what it renders with the live objects and writes only what differs.

Who owns which field (everything else on these objects is left to whoever set it):

- EngineBuild: created when absent; its spec is immutable (a CEL rule), its status is the operator's.
- Deployment: everything rendered, `spec.replicas` included. The replica count is the SpeculativeDeployment's
  `spec.replicas`, which an HPA or KEDA changes through the SpeculativeDeployment's scale subresource,
  never on the Deployment.
- ConfigMap, Service, PodDisruptionBudget, HorizontalPodAutoscaler, the deployment's own cache claim:
  everything rendered.
- The operator's default cache claim: created when absent, never changed (it may be a user's).
- ScaledObject: everything rendered; no index (KEDA is optional), so it is compared at each periodic resync.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.builders import (
    METRIC_NAMES,
    build_autoscaler,
    build_cache_pvc,
    build_configmap,
    build_default_cache_pvc,
    build_deployment,
    build_engine_builds,
    build_pdb,
    build_service,
    cache_pvc_name,
    endpoint,
    quantity,
    status_selector,
)
from specdeploy_operator.builders.autoscaling import KEDA_API_VERSION

from .indexes import Obj, every
from .kube import ApiError, ObjectRef, ref_of
from .livestate import contains, first_difference
from .status import (
    SPECULATION_EFFECTIVE,
    ConditionSpec,
    EngineObservation,
    ServingObservation,
    deployment_status,
    hpa_report,
    merge_conditions,
)

if TYPE_CHECKING:
    from .reconciler import Reconciler

__all__ = ["AUTOSCALER_RETRY_SECONDS", "ReconcileFailed", "reconcile_deployment"]

log = logging.getLogger(__name__)


class ReconcileFailed(Exception):
    """A reconcile that could not do everything; its status already says why. The queue retries it."""


AUTOSCALER_RETRY_SECONDS = 60.0
"""How soon a ScaledObject that could not be created (KEDA not installed) is tried again."""


async def reconcile_deployment(r: Reconciler, namespace: str, name: str) -> float | None:
    body = r.observe("SpeculativeDeployment", namespace, name)
    if body is None or (body.get("metadata") or {}).get("deletionTimestamp"):
        return None
    try:
        sdep = SpeculativeDeployment.model_validate(body)
    except ValidationError as invalid:
        await _write_invalid(r, body, invalid)
        return None
    error: str | None = None
    sync_reason = "ReconcileError"
    engines: list[EngineObservation] = []
    deployment: Obj | None = r.observe("Deployment", namespace, name)
    current = started = False
    autoscaler: dict[str, Any] | None = None
    retry: float | None = None
    desired_engines = build_engine_builds(sdep, r.settings)
    step = "engines"
    try:
        engines = await ensure_engines(r, desired_engines)
        step = "engine cache"
        await ensure_cache(r, sdep)
        step = "serving objects"
        deployment, current, started = await ensure_serving(r, body, sdep, desired_engines, engines)
        step = "autoscaler"
        autoscaler, retry = await ensure_autoscaler(r, body, sdep)
    except Exception as failure:  # reported in status, then retried with back-off by the queue
        if isinstance(failure, ApiError) and failure.namespace_terminating:
            # The namespace is being deleted and this deployment with it: nothing to create or report; the
            # reconciler pauses work in the namespace (TERMINATING_PAUSE_SECONDS) instead of retrying.
            log.info("namespace terminating; not reconciled", extra={"object": f"{namespace}/{name}"})
            r.namespace_terminating(namespace)
            return None
        reason = failure.reason if isinstance(failure, ApiError) else f"{type(failure).__name__}: {failure}"
        error = f"reconciling the {step} failed: {reason}"
        if isinstance(failure, ApiError) and failure.rbac_denied:
            sync_reason = "Forbidden"
            error += " (the operator's Role or ClusterRole lacks this permission: see the chart's rbac.yaml)"
        log.warning("reconcile failed", extra={"object": f"{namespace}/{name}", "error": error})
        if not engines:
            engines = [_engine_observation(r, e) for e in desired_engines]
        if not current and step != "autoscaler":
            # The failure came before the Deployment was looked at: whether it is current is read from it,
            # so that a refused repair of another child does not report a Ready deployment as rolling out.
            current = _live_deployment_current(r, sdep, desired_engines, engines, deployment)
    await report(
        r, body, sdep, engines, deployment, current, autoscaler, error, sync_reason, rollout_started=started
    )
    if error is not None:
        raise ReconcileFailed(error)
    return retry


def _engine_observation(r: Reconciler, engine: Obj) -> EngineObservation:
    meta, spec = engine["metadata"], engine["spec"]
    observed = r.observe("EngineBuild", str(meta.get("namespace") or ""), str(meta["name"]))
    return EngineObservation(spec["role"], meta["name"], spec["hash"], observed)


async def ensure_engines(r: Reconciler, desired: list[dict[str, Any]]) -> list[EngineObservation]:
    """Create the EngineBuilds that do not exist yet (shared ones are found by name); their observations."""
    engines: list[EngineObservation] = []
    for engine in desired:
        meta = engine["metadata"]
        observed, created = await r.create_if_absent(engine)
        if created:
            r.queue.add(("engine", str(meta.get("namespace") or ""), str(meta["name"])))
        engines.append(
            EngineObservation(engine["spec"]["role"], meta["name"], engine["spec"]["hash"], observed)
        )
    return engines


async def ensure_cache(r: Reconciler, sdep: SpeculativeDeployment) -> None:
    """The engine cache: the deployment's own claim (kept as rendered), or the operator's shared default
    claim (created when missing, never changed)."""
    own_claim = build_cache_pvc(sdep, r.settings)
    if own_claim is not None:
        await r.ensure(own_claim)
    elif cache_pvc_name(sdep, r.settings) == r.settings.cache_pvc_name:
        await r.create_if_absent(build_default_cache_pvc(sdep.metadata.namespace or "", r.settings))


async def ensure_serving(
    r: Reconciler,
    body: Obj,
    sdep: SpeculativeDeployment,
    desired_engines: list[dict[str, Any]],
    engines: list[EngineObservation],
) -> tuple[Obj | None, bool, bool]:
    """ConfigMap, Service, PDB and Deployment once every engine is built; (Deployment, does it carry the
    desired pod template and has its controller seen it?, was a new pod template rolled out now?)."""
    namespace, name = sdep.metadata.namespace or "", sdep.metadata.name or ""
    deployment = r.observe("Deployment", namespace, name)
    if not all(e.phase == "Succeeded" for e in engines):
        if deployment is not None and (deployment.get("spec") or {}).get("replicas") != sdep.spec.replicas:
            # Engines are being rebuilt: the old pods keep serving, but a scale change applies now.
            deployment = await r.kube.patch(ref_of(deployment), {"spec": {"replicas": sdep.spec.replicas}})
        return deployment, False, False
    configmap = build_configmap(sdep, desired_engines, r.settings)
    for child in (configmap, build_service(sdep), build_pdb(sdep)):
        await r.ensure(child)
    desired = build_deployment(sdep, desired_engines, r.settings, configmap=configmap)
    before = deployment
    deployment, applied = await r.ensure(desired)
    started = applied and _template_changed(before, desired)
    if started:
        await r.kube.event(
            body,
            "Normal",
            "RolloutStarted",
            f"rolling out {name} ({sdep.spec.replicas} replicas, {sdep.spec.gpus_per_replica} GPUs each)",
        )
    return deployment, _deployment_current(deployment, desired), started


def _template_changed(observed: Obj | None, desired: Obj) -> bool:
    if observed is None:
        return True
    old = ((observed.get("spec") or {}).get("template") or {}).get("metadata") or {}
    new = desired["spec"]["template"]["metadata"]
    annotations = old.get("annotations") or {}
    return any(annotations.get(k) != v for k, v in new.get("annotations", {}).items())


def _unobserved(deployment: Obj | None) -> bool:
    """Whether the Deployment's controller has yet to observe its latest generation."""
    if deployment is None:
        return False
    generation = (deployment.get("metadata") or {}).get("generation") or 0
    return bool(((deployment.get("status") or {}).get("observedGeneration") or 0) < generation)


def _live_deployment_current(
    r: Reconciler,
    sdep: SpeculativeDeployment,
    desired_engines: list[dict[str, Any]],
    engines: list[EngineObservation],
    deployment: Obj | None,
) -> bool:
    if deployment is None or not all(e.phase == "Succeeded" for e in engines):
        return False
    try:
        desired = build_deployment(sdep, desired_engines, r.settings)
    except Exception:  # the builders failed: then nothing was written either
        return False
    return _deployment_current(deployment, desired)


def _deployment_current(deployment: Obj | None, desired: Obj) -> bool:
    """Whether the Deployment holds the desired template and its controller has seen that generation."""
    if deployment is None or not contains(deployment, desired):
        return False
    generation = (deployment.get("metadata") or {}).get("generation") or 0
    observed = (deployment.get("status") or {}).get("observedGeneration") or 0
    return bool(observed >= generation)


async def ensure_autoscaler(
    r: Reconciler, body: Obj, sdep: SpeculativeDeployment
) -> tuple[dict[str, Any] | None, float | None]:
    """Create or update the autoscaler `spec.autoscaling` asks for and delete one it no longer asks for.
    Returns `status.autoscaler` and, when creating it failed, when to try again."""
    namespace, name = sdep.metadata.namespace or "", sdep.metadata.name or ""
    desired = build_autoscaler(sdep, r.settings)
    kind = desired["kind"] if desired is not None else None
    hpa = r.observe("HorizontalPodAutoscaler", namespace, name)
    if hpa is not None and kind != "HorizontalPodAutoscaler":
        await r.delete(ref_of(hpa), (hpa.get("metadata") or {}).get("uid"))
    previous = (body.get("status") or {}).get("autoscaler") or {}
    if previous.get("kind") == "ScaledObject" and kind != "ScaledObject":
        r.scaled_objects.pop((namespace, name), None)
        await r.delete(ObjectRef(KEDA_API_VERSION, "ScaledObject", namespace, str(previous["name"])))
    auto = sdep.spec.autoscaling
    if desired is None or auto is None:
        return None, None
    report_: dict[str, Any] = {
        "kind": kind,
        "name": name,
        "metric": METRIC_NAMES[auto.metric],
        "target": quantity(auto.target_value),
    }
    if kind == "HorizontalPodAutoscaler":
        result, _ = await r.ensure(desired)
        report_.update(hpa_report(result))
        return report_, None
    memo = r.scaled_objects.get((namespace, name))
    if memo is not None and first_difference(memo, desired["spec"]) is None:
        return report_, None
    try:
        await r.kube.apply(desired)
    except ApiError as error:
        if error.status not in (403, 404):
            raise
        why = "not served by the cluster (is KEDA installed?)" if error.status == 404 else "forbidden"
        report_["message"] = (
            f"ScaledObject {name} cannot be created: {KEDA_API_VERSION} ScaledObject is {why}"
        )
        if previous.get("message") != report_["message"]:
            await r.kube.event(body, "Warning", "AutoscalerFailed", report_["message"])
        return report_, AUTOSCALER_RETRY_SECONDS
    r.scaled_objects[(namespace, name)] = desired["spec"]
    return report_, None


async def report(  # noqa: PLR0917 - one call site, every argument an observation of this reconcile
    r: Reconciler,
    body: Obj,
    sdep: SpeculativeDeployment,
    engines: list[EngineObservation],
    deployment: Obj | None,
    current: bool,
    autoscaler: dict[str, Any] | None,
    error: str | None,
    sync_reason: str = "ReconcileError",
    *,
    rollout_started: bool = False,
) -> None:
    """Roll what is live up into the deployment's status; `error` (a write the API server refused) becomes the
    `Synced` condition (reason `sync_reason`), with an event when it first appears: one event per distinct
    refusal, not one per retry."""
    namespace, name = sdep.metadata.namespace or "", sdep.metadata.name or ""
    previous: Obj = body.get("status") or {}
    generation = (body.get("metadata") or {}).get("generation")
    settled = previous.get("phase") == "Ready" and previous.get("observedGeneration") == generation
    in_sync = any(
        c.get("type") == "Synced" and c.get("status") == "True" for c in previous.get("conditions") or ()
    )
    if error is None and settled and in_sync and _unobserved(deployment):
        # A Ready deployment whose Deployment's controller has not seen its latest spec yet (the operator
        # just reverted a hand edit) while the user asked for nothing new: nothing is known that the status
        # does not say, and the controller's status update is a watch event that reconciles again. Writing
        # now would flap `updatedReplicas` and the phase for the few milliseconds of the controller's lag.
        return
    pods = every(r.indices.get("pods"), (namespace, "serving", name))
    status = deployment_status(
        generation=generation,
        desired_replicas=sdep.spec.replicas,
        engines=engines,
        serving=ServingObservation(deployment, current, pods),
        selector=status_selector(sdep),
        endpoint=endpoint(sdep),
        gpus_per_replica=sdep.spec.gpus_per_replica,
        gpu_resource=sdep.spec.placement.gpu_resource,
        autoscaler=autoscaler,
        previous=previous,
        keep_previous=r.settings.keep_previous_engines,
        now=r.clock(),
        sync_error=error,
        sync_reason=sync_reason,
        speculation=r.speculation.published((namespace, name)),
        speculation_condition=r.speculation.condition((namespace, name), r.settings.low_acceptance_rate),
    )
    # The `Deploying` milestone says nothing the `RolloutStarted` event of this reconcile has not said.
    await r.write_status(body, status, quiet=("Deploying",) if rollout_started else ())
    await _acceptance_event(r, body, previous, status)
    old_sync: Obj = next((c for c in previous.get("conditions") or () if c.get("type") == "Synced"), {})
    if error is not None and old_sync.get("message") != error[:4096]:
        await r.kube.event(body, "Warning", sync_reason, error)


async def _acceptance_event(r: Reconciler, body: Obj, previous: Obj, status: Obj) -> None:
    """A Warning event when speculation stops paying (condition `SpeculationEffective` turns False)."""

    def effective(s: Obj) -> Obj:
        return next((c for c in s.get("conditions") or () if c.get("type") == SPECULATION_EFFECTIVE), {})

    now, before = effective(status), effective(previous)
    if now.get("status") == "False" and before.get("status") != "False":
        await r.kube.event(body, "Warning", str(now["reason"]), str(now["message"]))


async def _write_invalid(r: Reconciler, body: Obj, error: ValidationError) -> None:
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
        r.clock(),
        generation,
    )
    await r.write_status(body, status)
