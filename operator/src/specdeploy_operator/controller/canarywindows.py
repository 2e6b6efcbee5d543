"""The canary's comparison: per DraftTraining, both sides' counter deltas summed over the sampling rounds in
which the canary and the deployment's own replicas both took steps, so each side is measured over the same
traffic period. Kept in memory: an operator restart starts the sums again (the window's end stays)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from .promotionplan import Figures
from .speculation import CANARY_PREFIX, Window

__all__ = ["CanaryWindows"]

Key = tuple[str, str]


def _plus(figures: Figures, window: Window) -> Figures:
    return replace(
        figures,
        drafted=figures.drafted + window.drafted,
        accepted=figures.accepted + window.accepted,
        steps=figures.steps + window.steps,
        generated=figures.generated + window.generated,
    )


class CanaryWindows:
    def __init__(self) -> None:
        self._sums: dict[Key, tuple[Figures, Figures]] = {}

    def add(self, windows: Mapping[Key, Window], deployment_of: Callable[[Key], Key | None]) -> list[Key]:
        """Add a round's windows; returns the DraftTrainings (namespace, name) whose sums grew."""
        grew = []
        for key, canary in windows.items():
            namespace, name = key
            if not name.startswith(CANARY_PREFIX):
                continue
            deployment = deployment_of(key)
            current = windows.get(deployment) if deployment is not None else None
            if current is None:
                continue
            training = (namespace, name.removeprefix(CANARY_PREFIX))
            sums = self._sums.get(training, (Figures(), Figures()))
            self._sums[training] = (_plus(sums[0], canary), _plus(sums[1], current))
            grew.append(training)
        return grew

    def figures(self, training: Key) -> tuple[Figures, Figures] | None:
        """(canary, current) summed so far, or None."""
        return self._sums.get(training)

    def keep(self, trainings: Iterable[Key]) -> None:
        """Forget the sums of every other DraftTraining (its canary is gone)."""
        wanted = set(trainings)
        for key in list(self._sums):
            if key not in wanted:
                del self._sums[key]
