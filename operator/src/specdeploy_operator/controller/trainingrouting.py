"""The reconciler's routing of DraftTrainings: which trainings a deployment has, which deployment a canary
serves beside, and what to queue when either changes. A mixin of `Reconciler`, read from its indexes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .canarywindows import CanaryWindows
from .indexes import Obj, one
from .promotionplan import Figures
from .queue import WorkQueue
from .speculation import CANARY_PREFIX

__all__ = ["TrainingRouting"]


class TrainingRouting:
    indices: Mapping[str, Any]
    queue: WorkQueue[Any]
    canaries: CanaryWindows

    def training_changed(self, namespace: str, name: str) -> None:
        """Reconcile the DraftTraining, and its deployment (which serves a promoted draft)."""
        self.queue.add(("training", namespace, name))
        deployment = (
            (one(self.indices.get("drafttrainings"), (namespace, name)) or {}).get("spec") or {}
        ).get("deployment")
        if deployment:
            self.queue.add(("sdep", namespace, str(deployment)))

    def _trainings_of(self, namespace: str, deployment: str) -> None:
        """Reconcile the DraftTrainings of `deployment` (one waits for it to be Ready)."""
        for body in self.trainings_of(namespace, deployment):
            self.queue.add(("training", namespace, str(body["metadata"]["name"])))

    def trainings_of(self, namespace: str, deployment: str) -> list[Obj]:
        trainings = self.indices.get("drafttrainings") or {}
        found = []
        for key in list(trainings):
            body = one(trainings, key) if key[0] == namespace else None
            if body is not None and (body.get("spec") or {}).get("deployment") == deployment:
                found.append(body)
        return found

    def _canary_of(self, key: tuple[str, str]) -> tuple[str, str] | None:
        """The deployment a canary's sampler key serves beside."""
        namespace, name = key
        body = one(self.indices.get("drafttrainings"), (namespace, name.removeprefix(CANARY_PREFIX)))
        deployment = ((body or {}).get("spec") or {}).get("deployment")
        return (namespace, str(deployment)) if deployment else None

    def canary_figures(self, namespace: str, training: str) -> tuple[Figures, Figures] | None:
        return self.canaries.figures((namespace, training))
