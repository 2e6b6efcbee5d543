"""The examples as the builder unit tests read them: parsed, their engine hashes, their Deployment."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.builders import (
    OperatorSettings,
    build_deployment,
    build_engine_builds,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SETTINGS = OperatorSettings()


def example_body(stem: str) -> dict[str, Any]:
    body = yaml.safe_load((EXAMPLES / f"{stem}.yaml").read_text())
    assert isinstance(body, dict)
    return body


def parsed_example(body: dict[str, Any]) -> SpeculativeDeployment:
    sdep = parse_object(copy.deepcopy(body))
    assert isinstance(sdep, SpeculativeDeployment)
    return sdep


def engine_hashes(body: dict[str, Any]) -> dict[str, str]:
    return {e["spec"]["role"]: e["spec"]["hash"] for e in build_engine_builds(parsed_example(body), SETTINGS)}


def gpus_of(deployment: dict[str, Any]) -> str:
    limits: dict[str, str] = deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
    return limits["nvidia.com/gpu"]


def deployment_of(sdep: SpeculativeDeployment) -> dict[str, Any]:
    return build_deployment(sdep, build_engine_builds(sdep, SETTINGS), SETTINGS)


COLOCATED = "tensorrt/01-draft-target-llama70b-8b-h100"
DEDICATED = "tensorrt/03-draft-target-dedicated-logits"
