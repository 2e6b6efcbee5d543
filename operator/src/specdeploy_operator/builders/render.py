"""Everything the operator would create for one SpeculativeDeployment, in apply order
(`specdeploy render`)."""

from __future__ import annotations

from typing import Any

import yaml

from specdeploy_operator.api import SpeculativeDeployment

from .autoscaling import build_autoscaler
from .claims import build_cache_pvc
from .engines import engine_builds
from .job import build_job
from .serving import serving_children
from .settings import OperatorSettings

__all__ = ["dump_yaml", "render_children"]


def render_children(
    sdep: SpeculativeDeployment, settings: OperatorSettings | None = None
) -> list[dict[str, Any]]:
    """The engine-cache claim when the operator creates one, EngineBuilds, their Jobs, then ConfigMap,
    Deployment (a LeaderWorkerSet when a replica spans nodes), Service, PodDisruptionBudget and the autoscaler
    (HorizontalPodAutoscaler or ScaledObject) when `spec.autoscaling` is set."""
    settings = settings or OperatorSettings()
    engines = engine_builds(sdep, settings)
    objects: list[dict[str, Any]] = []
    pvc = build_cache_pvc(sdep, settings)
    if pvc is not None:
        objects.append(pvc)
    for engine in engines:
        objects.append(engine.to_dict())
        objects.append(build_job(engine, settings))
    serving = serving_children(sdep, engines, settings)
    objects += [serving.configmap, serving.workload, serving.service, serving.pdb]
    autoscaler = build_autoscaler(sdep, settings)
    if autoscaler is not None:
        objects.append(autoscaler)
    return objects


class _NoAliasDumper(yaml.SafeDumper):
    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data and all(line == line.rstrip() for line in data.splitlines()) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_NoAliasDumper.add_representer(str, _str)


def dump_yaml(objects: list[dict[str, Any]]) -> str:
    """Multi-document YAML, keys in build order, no anchors."""
    return yaml.dump_all(objects, Dumper=_NoAliasDumper, sort_keys=False, explicit_start=True, width=120)
