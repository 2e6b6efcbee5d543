"""What reconciling one SpeculativeDeployment should do, and what its status then says: pure functions of the
resource, what was observed and the settings; no API calls. `deployments.py` observes, asks `plan_deployment`,
applies the plan through the cluster port, and asks `deployment_report` for the status and events.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from specdeploy_operator.api import (
    BuildPhase,
    ConditionStatus,
    ConditionType,
    DeploymentPhase,
    EngineBuild,
    EventType,
    Reason,
    SpeculativeDeployment,
)
from specdeploy_operator.builders import (
    CacheClaim,
    OperatorSettings,
    ServingChildren,
    autoscaler_report,
    build_autoscaler,
    cache_claim,
    endpoint,
    serving_children,
    status_selector,
)
from specdeploy_operator.builders.autoscaling import KEDA_API_VERSION
from specdeploy_operator.builders.common import COMPONENT_LABEL, SERVER_COMPONENT
from specdeploy_operator.builders.leaderworkerset import NAME_LABEL as LWS_NAME_LABEL

from .conditions import ConditionSpec, find_condition, merge_conditions
from .events import Event, acceptance_event, cache_event, sync_event
from .kube import ObjectRef
from .livestate import contains
from .podcreation import PodCreationProblem
from .status import EngineObservation, ServingObservation, deployment_status

__all__ = [
    "AutoscalerPlan",
    "DeploymentPlan",
    "Observed",
    "Outcome",
    "Report",
    "ServingPlan",
    "deployment_current",
    "deployment_report",
    "invalid_status",
    "leaders_current",
    "may_retire",
    "plan_deployment",
    "retired_event",
    "template_changed",
]

Obj = Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Observed:
    """What the reconcile read before acting: each desired EngineBuild by name, the serving workload of the
    kind the spec asks for (a Deployment, or a LeaderWorkerSet when a replica spans nodes), the
    HorizontalPodAutoscaler, and the workload of the other kind left from before the spec changed between one
    node and several (None: there is none)."""

    engines: Mapping[str, Obj | None]
    workload: Obj | None
    hpa: Obj | None
    retired: Obj | None = None

    def engine_observations(self, engines: Sequence[EngineBuild]) -> list[EngineObservation]:
        return [
            EngineObservation(
                e.spec.role, e.metadata.name or "", e.spec.hash, self.engines.get(e.metadata.name or "")
            )
            for e in engines
        ]


@dataclass(frozen=True, slots=True)
class ServingPlan:
    """The serving objects once every engine is built (`children`); until then only the replica count of a
    workload that still serves the old engines (`replicas`, when it differs). `rollout` is posted when the
    workload's pod template changes now. `retire`: the workload of the other kind, deleted once the new one
    serves every replica (`may_retire`), so a change between one node and several makes before it breaks."""

    children: ServingChildren | None
    replicas: int | None
    rollout: Event
    retire: Obj | None = None


@dataclass(frozen=True, slots=True)
class AutoscalerPlan:
    """The autoscaler `spec.autoscaling` asks for (`desired`), the ones it no longer asks for, and the
    `status.autoscaler` that says what it is (the apply adds what the autoscaler reports)."""

    desired: dict[str, Any] | None
    remove_hpa: Obj | None
    remove_scaled_object: ObjectRef | None
    report: dict[str, Any] | None

    def refusal(self, status: int) -> str:
        """`status.autoscaler.message` for a ScaledObject the API server refused to create."""
        why = "not served by the cluster (is KEDA installed?)" if status == 404 else "forbidden"
        name = (self.report or {}).get("name")
        return f"ScaledObject {name} cannot be created: {KEDA_API_VERSION} ScaledObject is {why}"


@dataclass(frozen=True, slots=True)
class DeploymentPlan:
    """Every child of one deployment, in apply order: EngineBuilds, the cache claim, the serving objects, the
    autoscaler."""

    engines: tuple[EngineBuild, ...]
    cache: CacheClaim | None
    serving: ServingPlan
    autoscaler: AutoscalerPlan


def _serving(
    sdep: SpeculativeDeployment,
    engines: Sequence[EngineBuild],
    observed: Observed,
    settings: OperatorSettings,
) -> ServingPlan:
    spec = sdep.spec
    nodes = spec.nodes_per_replica
    shape = f"{spec.gpus_per_replica} GPUs each" + (f" on {nodes} nodes" if nodes > 1 else "")
    rollout = Event(
        EventType.NORMAL,
        Reason.ROLLOUT_STARTED,
        f"rolling out {sdep.metadata.name or ''} ({spec.replicas} replicas, {shape})",
    )
    built = all(e.phase == BuildPhase.SUCCEEDED for e in observed.engine_observations(engines))
    if built:
        return ServingPlan(serving_children(sdep, engines, settings), None, rollout, observed.retired)
    live = observed.workload
    if live is not None and (live.get("spec") or {}).get("replicas") != spec.replicas:
        # Engines are being rebuilt: the old pods keep serving, but a scale change applies now.
        return ServingPlan(None, spec.replicas, rollout)
    return ServingPlan(None, None, rollout)


def _autoscaler(
    sdep: SpeculativeDeployment, body: Obj, observed: Observed, settings: OperatorSettings
) -> AutoscalerPlan:
    desired = build_autoscaler(sdep, settings)
    kind = desired["kind"] if desired is not None else None
    hpa = observed.hpa if observed.hpa is not None and kind != "HorizontalPodAutoscaler" else None
    previous = (body.get("status") or {}).get("autoscaler") or {}
    scaled_object = None
    if previous.get("kind") == "ScaledObject" and kind != "ScaledObject":
        namespace = sdep.metadata.namespace or ""
        scaled_object = ObjectRef(KEDA_API_VERSION, "ScaledObject", namespace, str(previous["name"]))
    return AutoscalerPlan(desired, hpa, scaled_object, autoscaler_report(sdep))


def plan_deployment(
    sdep: SpeculativeDeployment,
    body: Obj,
    engines: Sequence[EngineBuild],
    observed: Observed,
    settings: OperatorSettings,
) -> DeploymentPlan:
    """Every child `sdep` needs, given its desired `engines` (`builders.engine_builds`) and what is
    observed."""
    return DeploymentPlan(
        engines=tuple(engines),
        cache=cache_claim(sdep, settings),
        serving=_serving(sdep, engines, observed, settings),
        autoscaler=_autoscaler(sdep, body, observed, settings),
    )


def _template_metadata(workload: Obj) -> Obj:
    """The metadata of a workload's (leader) pod template."""
    spec = workload.get("spec") or {}
    if workload.get("kind") == "LeaderWorkerSet":
        return ((spec.get("leaderWorkerTemplate") or {}).get("leaderTemplate") or {}).get("metadata") or {}
    return (spec.get("template") or {}).get("metadata") or {}


def template_changed(observed: Obj | None, desired: Obj) -> bool:
    """Whether applying `desired` over the `observed` workload rolls out a new pod template."""
    if observed is None:
        return True
    annotations = _template_metadata(observed).get("annotations") or {}
    return any(annotations.get(k) != v for k, v in _template_metadata(desired).get("annotations", {}).items())


def _unobserved(workload: Obj | None) -> bool:
    """Whether the workload's controller has yet to observe its latest generation. A LeaderWorkerSet's
    status does not say which generation it describes: its counts are taken as they are."""
    if workload is None or workload.get("kind") == "LeaderWorkerSet":
        return False
    generation = (workload.get("metadata") or {}).get("generation") or 0
    return bool(((workload.get("status") or {}).get("observedGeneration") or 0) < generation)


def deployment_current(workload: Obj | None, desired: Obj) -> bool:
    """Whether the workload holds the desired template and its controller has seen that generation."""
    return workload is not None and contains(workload, desired) and not _unobserved(workload)


def leaders_current(desired: Obj, pods: Sequence[Obj]) -> bool:
    """Whether every leader pod of the LeaderWorkerSet `desired` runs its pod template (carries its
    annotations: configuration and engine hashes). A LeaderWorkerSet's status names no generation, so right
    after a change its counts may still be the old template's: its pods tell. Always true for a Deployment,
    whose `observedGeneration` says it."""
    if desired.get("kind") != "LeaderWorkerSet":
        return True
    want = _template_metadata(desired).get("annotations") or {}
    name = (desired.get("metadata") or {}).get("name")
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        if labels.get(LWS_NAME_LABEL) != name or labels.get(COMPONENT_LABEL) != SERVER_COMPONENT:
            continue
        if meta.get("deletionTimestamp"):
            continue
        annotations = meta.get("annotations") or {}
        if any(annotations.get(k) != v for k, v in want.items()):
            return False
    return True


def may_retire(workload: Obj | None, current: bool) -> bool:
    """Whether the workload of the other kind can go: the new `workload` is current and every one of its
    replicas is ready."""
    wanted = int(((workload or {}).get("spec") or {}).get("replicas") or 0)
    ready = int(((workload or {}).get("status") or {}).get("readyReplicas") or 0)
    return current and ready >= wanted


def retired_event(retired: Obj, workload: Obj) -> Event:
    """The event of deleting `retired`, now that `workload` serves every replica."""
    old = f"{retired.get('kind')} {(retired.get('metadata') or {}).get('name')}"
    new = f"{workload.get('kind')} {(workload.get('metadata') or {}).get('name')}"
    return Event(EventType.NORMAL, Reason.WORKLOAD_REPLACED, f"{new} serves every replica: deleted {old}")


@dataclass(frozen=True, slots=True)
class Outcome:
    """What applying a plan found: the engines and the Deployment as they are now, whether the Deployment is
    current and a rollout started, the autoscaler's report, and the write the API server refused, if any."""

    engines: list[EngineObservation]
    workload: Obj | None
    current: bool
    rollout_started: bool
    autoscaler: dict[str, Any] | None
    error: str | None
    sync_reason: Reason


@dataclass(frozen=True, slots=True)
class Report:
    """The status to write, the phases whose milestone the reconcile already posted (`quiet`), and the events
    posted whether or not the status changes."""

    status: dict[str, Any]
    quiet: tuple[str, ...]
    events: list[Event]


def deployment_report(
    sdep: SpeculativeDeployment,
    body: Obj,
    *,
    outcome: Outcome,
    pods: Sequence[Obj],
    creation: PodCreationProblem | None = None,
    cache: ConditionSpec | None = None,
    speculation: tuple[Obj | None, ConditionSpec | None],
    settings: OperatorSettings,
    now: datetime,
) -> Report | None:
    """Roll what is live up into the deployment's status; a refused write becomes the `Synced` condition, with
    an event when it first appears. None: nothing is to be written."""
    previous: Obj = body.get("status") or {}
    generation = (body.get("metadata") or {}).get("generation")
    settled = (
        previous.get("phase") == DeploymentPhase.READY and previous.get("observedGeneration") == generation
    )
    in_sync = find_condition(previous, ConditionType.SYNCED).get("status") == ConditionStatus.TRUE
    if outcome.error is None and settled and in_sync and _unobserved(outcome.workload):
        # A Ready deployment whose Deployment's controller has not seen its latest spec yet (the operator
        # just reverted a hand edit) while the user asked for nothing new: nothing is known that the status
        # does not say, and the controller's status update is a watch event that reconciles again. Writing
        # now would flap `updatedReplicas` and the phase for the few milliseconds of the controller's lag.
        return None
    figures, effective = speculation
    status = deployment_status(
        generation=generation,
        desired_replicas=sdep.spec.replicas,
        engines=outcome.engines,
        serving=ServingObservation(outcome.workload, outcome.current, pods, creation),
        selector=status_selector(sdep),
        endpoint=endpoint(sdep),
        model_name=sdep.spec.served_model_names[0],
        gpus_per_replica=sdep.spec.gpus_per_replica,
        nodes_per_replica=sdep.spec.nodes_per_replica,
        gpu_resource=sdep.spec.placement.gpu_resource,
        autoscaler=outcome.autoscaler,
        previous=previous,
        keep_previous=settings.keep_previous_engines,
        now=now,
        sync_error=outcome.error,
        sync_reason=outcome.sync_reason,
        speculation=figures,
        speculation_condition=effective,
        cache_condition=cache,
    )
    events = [
        acceptance_event(previous, status),
        cache_event(previous, status),
        sync_event(previous, outcome.error, outcome.sync_reason),
    ]
    # The `Deploying` milestone says nothing the `RolloutStarted` event of this reconcile has not said.
    quiet = (str(DeploymentPhase.DEPLOYING),) if outcome.rollout_started else ()
    return Report(status, quiet, [e for e in events if e is not None])


def invalid_status(body: Obj, error: ValidationError, now: datetime) -> dict[str, Any]:
    """The status of a spec the API server admitted but the operator's model rejects (e.g. an older CRD
    version): `Failed`, with the model's errors in `Degraded`; nothing else is touched."""
    message = "; ".join(
        f"spec{''.join(f'.{p}' for p in e['loc'][1:]) if e['loc'][:1] == ('spec',) else ''}: {e['msg']}"
        for e in error.errors()
    )
    previous = body.get("status") or {}
    generation = body["metadata"].get("generation")
    status = dict(previous)
    status["phase"] = str(DeploymentPhase.FAILED)
    status["observedGeneration"] = generation
    degraded = ConditionSpec(ConditionType.DEGRADED, ConditionStatus.TRUE, Reason.INVALID_SPEC, message)
    status["conditions"] = merge_conditions(previous.get("conditions"), [degraded], now, generation)
    return status
