"""Which EngineBuilds a deployment uses: those its spec renders now, and those its status still lists (in use
by running pods, or kept for rollback). The `engine_users` index (EngineBuild -> deployments) is built from
this at every watch event of every SpeculativeDeployment: each status write and each pod that becomes ready
brings one. Rendering means validating the spec and running the builders, so `EngineNames` remembers what a
spec renders; the status part is read every time."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Final

from pydantic import ValidationError

from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.builders import OperatorSettings, engine_builds

from .indexes import Obj

__all__ = ["EngineNames", "engine_names_in_status", "engines_used", "rendered_engine_names"]

RENDERINGS_KEPT: Final = 4096
"""Specs whose rendered engine names `EngineNames` keeps (the oldest go first)."""


def engine_names_in_status(status: Obj | None) -> set[str]:
    engines = (status or {}).get("engines") or {}
    names = {
        str(ref["name"]) for role, ref in engines.items() if role != "previous" and isinstance(ref, Mapping)
    }
    names.update(str(n) for n in engines.get("previous") or ())
    return names


def rendered_engine_names(body: Obj, settings: OperatorSettings) -> frozenset[str]:
    """The EngineBuild names the deployment's spec renders (none for a spec the model rejects)."""
    try:
        sdep = SpeculativeDeployment.model_validate(body)
    except ValidationError:
        return frozenset()
    return frozenset(e.metadata.name or "" for e in engine_builds(sdep, settings))


def engines_used(body: Obj, settings: OperatorSettings) -> set[str]:
    """EngineBuild names a deployment uses: those its spec renders now, and those its status still lists."""
    return engine_names_in_status(body.get("status")) | rendered_engine_names(body, settings)


class EngineNames:
    """`engines_used` with the rendered part remembered by the deployment's namespace, name and spec."""

    def __init__(self, settings: OperatorSettings, kept: int = RENDERINGS_KEPT) -> None:
        self.settings = settings
        self.kept = kept
        self._rendered: dict[str, frozenset[str]] = {}
        self.renderings = 0  # how many times the builders ran (tests)

    def used(self, body: Obj) -> set[str]:
        meta = body.get("metadata") or {}
        key = json.dumps(
            [meta.get("namespace"), meta.get("name"), body.get("spec")], sort_keys=True, default=str
        )
        rendered = self._rendered.get(key)
        if rendered is None:
            rendered = rendered_engine_names(body, self.settings)
            self.renderings += 1
            if len(self._rendered) >= self.kept:
                del self._rendered[next(iter(self._rendered))]
            self._rendered[key] = rendered
        return engine_names_in_status(body.get("status")) | rendered
