"""A trained draft in service: the deployment as it serves a DraftTraining's draft (`serving_trained`), and
the canary that tries it first: one extra replica of that deployment behind the deployment's own Service.

The canary's pods carry the deployment's pod labels (so its Service sends them their share of requests) and
`specdeploy.dev/canary: <training>`, which its Deployment selects them by and which keeps them out of the
deployment's replica count and speculation figures. Its ConfigMap and Deployment are named after the
DraftTraining, which owns them. Pure."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Final

from pydantic import ValidationError

from specdeploy_operator.api import EngineBuild, SpeculativeDeployment

from .common import configmap_name, derived_name, owner_reference
from .serverconfig import build_configmap
from .serving import build_deployment
from .settings import OperatorSettings

__all__ = ["CANARY_LABEL", "canary_children", "canary_name", "serving_trained"]

CANARY_LABEL: Final = "specdeploy.dev/canary"
"""Label of a canary's pods: the DraftTraining's name."""


def serving_trained(sdep: SpeculativeDeployment, draft: str, uri: str) -> SpeculativeDeployment:
    """`sdep` serving the trained draft at `uri`: its draft model replaced (`draft: draftModel`), or, for
    `eagle3`, method `eagle3` with that head instead of its draft. Raises ValueError (the model's words) when
    the deployment cannot serve it (e.g. EAGLE-3 on backend `tensorrt`)."""
    body = sdep.to_dict()
    spec = body["spec"]
    if draft == "draftModel":
        spec["draft"]["model"] = {"uri": uri}
    else:
        spec.pop("draft", None)
        old = spec.get("speculative") or {}
        speculative: dict[str, Any] = {"method": "eagle3", "eagle": {"model": {"uri": uri}}}
        for key in ("draftLen", "maxDraftLen"):
            if key in old:
                speculative[key] = old[key]
        spec["speculative"] = speculative
    body.pop("status", None)
    try:
        return SpeculativeDeployment.model_validate(body)
    except ValidationError as error:
        problems = "; ".join(str(e["msg"]) for e in error.errors())
        raise ValueError(f"{sdep.metadata.name} cannot serve the trained draft: {problems}") from error


def canary_name(training: str) -> str:
    return derived_name(training, "canary")


def canary_children(
    served: SpeculativeDeployment,
    engines: Sequence[EngineBuild | Mapping[str, Any]],
    training: Mapping[str, Any],
    settings: OperatorSettings,
) -> list[dict[str, Any]]:
    """The canary of the DraftTraining `training` (its live object): the ConfigMap and the one-replica
    Deployment of `served` (`serving_trained`), owned by the training."""
    name = canary_name(str(training["metadata"]["name"]))
    owner = owner_reference(training)
    configmap = copy.deepcopy(build_configmap(served, engines, settings))
    old_config = configmap_name(served)
    configmap["metadata"].update(name=name, ownerReferences=[owner])
    deployment = copy.deepcopy(build_deployment(served, engines, settings, configmap=configmap))
    meta = deployment["metadata"]
    meta.update(name=name, ownerReferences=[owner])
    meta["labels"] = {**meta["labels"], CANARY_LABEL: training["metadata"]["name"]}
    spec = deployment["spec"]
    spec["replicas"] = 1
    spec["selector"] = {
        "matchLabels": {**spec["selector"]["matchLabels"], CANARY_LABEL: meta["labels"][CANARY_LABEL]}
    }
    template = spec["template"]
    template["metadata"]["labels"] = {
        **template["metadata"]["labels"],
        CANARY_LABEL: meta["labels"][CANARY_LABEL],
    }
    for volume in template["spec"].get("volumes") or ():
        if (volume.get("configMap") or {}).get("name") == old_config:
            volume["configMap"]["name"] = name
    return [configmap, deployment]
