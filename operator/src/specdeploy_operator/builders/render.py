"""Everything the operator would create for one SpeculativeDeployment, in apply order
(`specdeploy render`)."""

from __future__ import annotations

from typing import Any

import yaml

from specdeploy_operator.api import SpeculativeDeployment

from .autoscaling import build_autoscaler
from .engines import build_engine_builds
from .job import build_job
from .serving import build_cache_pvc, build_configmap, build_deployment, build_pdb, build_service
from .settings import OperatorSettings

__all__ = ["dump_yaml", "render_children"]


def render_children(
    sdep: SpeculativeDeployment, settings: OperatorSettings | None = None
) -> list[dict[str, Any]]:
    """The engine-cache claim when the operator creates one, EngineBuilds, their Jobs, then ConfigMap,
    Deployment, Service, PodDisruptionBudget and the autoscaler (HorizontalPodAutoscaler or ScaledObject)
    when `spec.autoscaling` is set."""
    settings = settings or OperatorSettings()
    engines = build_engine_builds(sdep, settings)
    objects: list[dict[str, Any]] = []
    pvc = build_cache_pvc(sdep, settings)
    if pvc is not None:
        objects.append(pvc)
    for engine in engines:
        objects.append(engine)
        objects.append(build_job(engine, settings))
    objects.append(build_configmap(sdep, engines, settings))
    objects.append(build_deployment(sdep, engines, settings))
    objects.append(build_service(sdep))
    objects.append(build_pdb(sdep))
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
