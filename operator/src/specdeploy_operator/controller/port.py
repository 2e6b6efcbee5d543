"""The cluster as a reconcile sees it: a small port. Reconciling a SpeculativeDeployment or an EngineBuild
(`deployments.py`, `enginebuilds.py`) observes through it, plans with pure functions, and applies the plan
through it; the `Reconciler` implements it and is the only code that talks to the API server.

Reads come from kopf's indexes, with this process's own recent writes standing in while the indexes lag
behind them (read-your-writes). Writes compare with the live object first and write only what differs;
a status is written only when it changed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, Protocol

from specdeploy_operator.api import ApiModel
from specdeploy_operator.builders import OperatorSettings

from .conditions import ConditionSpec
from .events import Event, status_events
from .kube import ObjectRef
from .promotionplan import Figures

__all__ = ["Child", "ClusterPort", "Key", "Obj", "wire", "write_status"]

Obj = Mapping[str, Any]
Key = tuple[Literal["sdep", "engine", "training"], str, str]
"""A work-queue key: `("sdep", namespace, name)`, `("engine", namespace, name)` or `("training", namespace,
name)`."""
Child = ApiModel | Mapping[str, Any]
"""A desired object: a specdeploy model (an EngineBuild) or a Kubernetes object in wire form. Models are
serialised once, when they are applied."""


def wire(desired: Child) -> Mapping[str, Any]:
    """A desired object in wire form: a model is serialised here, once, as it is applied."""
    return desired.to_dict() if isinstance(desired, ApiModel) else desired


class ClusterPort(Protocol):
    """What a reconcile needs of the cluster."""

    @property
    def settings(self) -> OperatorSettings: ...

    def now(self) -> datetime: ...

    # -- observe -----------------------------------------------------------------------------------------
    def observe(self, kind: str, namespace: str, name: str) -> Obj | None:
        """The live object (None: there is none)."""
        ...

    def pods(self, namespace: str, owner: Literal["serving", "job"], name: str) -> list[Obj]:
        """The serving pods of a deployment, or the pods of a build Job."""
        ...

    def users_of(self, namespace: str, engine: str) -> list[str]:
        """Deployments that use the EngineBuild `engine`."""
        ...

    def speculation_figures(self, namespace: str, name: str) -> tuple[Obj | None, ConditionSpec | None]:
        """The deployment's published speculation figures and their `SpeculationEffective` condition."""
        ...

    def trainings_of(self, namespace: str, deployment: str) -> list[Obj]:
        """The DraftTrainings of `deployment`."""
        ...

    def canary_figures(self, namespace: str, training: str) -> tuple[Figures, Figures] | None:
        """(canary, current replicas) counter sums of a DraftTraining's canary so far (`canarywindows.py`)."""
        ...

    async def events_about(self, namespace: str, kind: str, name: str) -> Sequence[Obj]:
        """The events about an object (a Job whose pods cannot be created says so only there)."""
        ...

    # -- apply -------------------------------------------------------------------------------------------
    async def ensure(self, desired: Child) -> tuple[Obj, bool]:
        """Apply `desired` unless the live object holds every field of it; (object, applied?)."""
        ...

    async def create_if_absent(self, desired: Child) -> tuple[Obj, bool]:
        """Create `desired` unless an object of its name exists; (object, created?)."""
        ...

    async def patch(self, ref: ObjectRef, fields: Mapping[str, Any]) -> Obj:
        """Merge-patch fields of an object the operator owns only in part (replicas, an annotation)."""
        ...

    async def delete(self, ref: ObjectRef, uid: str | None = None) -> None:
        """Delete an object; one that is already gone is fine."""
        ...

    async def write_status(self, body: Obj, status: dict[str, Any]) -> Obj | None:
        """Write `status` unless it is what the object already says; the status it replaced when written."""
        ...

    async def event(self, body: Obj, event: Event) -> None:
        """Post `event` about `body`."""
        ...

    def enqueue(self, key: Key) -> None:
        """Reconcile `key` (soon)."""
        ...

    def namespace_terminating(self, namespace: str) -> None:
        """A write in `namespace` was refused because the namespace is being deleted."""
        ...


async def write_status(
    port: ClusterPort, body: Obj, status: dict[str, Any], quiet: tuple[str, ...] = ()
) -> None:
    """Write `status` through `port` when it changed, and post the events of the change (`events.py`)."""
    replaced = await port.write_status(body, status)
    if replaced is not None:
        for event in status_events(str(body["kind"]), replaced, status, quiet=quiet):
            await port.event(body, event)
