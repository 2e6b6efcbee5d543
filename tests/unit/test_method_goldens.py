"""Golden files: what each speculative method renders on the maintained path, from example 02 with the method
changed: the serving pod's containers (the draft checkpoints it fetches) and the server configuration, which
the server's own model loads.

Regenerate after an intended change with `SPECDEPLOY_UPDATE_GOLDEN=1 pytest tests/unit/test_method_goldens.py`
and review the diff."""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.builders import OperatorSettings, dump_yaml, render_children
from specdeploy_server.config import ServerConfig

from tests.example_files import EXAMPLES_DIR

GOLDEN = Path(__file__).resolve().parent / "golden_methods"
UPDATE = os.environ.get("SPECDEPLOY_UPDATE_GOLDEN") == "1"
BASE = EXAMPLES_DIR / "02-draft-target-llama8b-1b-h100.yaml"

METHODS: dict[str, dict[str, Any]] = {
    "ngram": {"method": "ngram", "draftLen": 4, "ngram": {"maxMatchingNgramSize": 3, "publicPool": False}},
    "suffix-automaton": {
        "method": "suffixAutomaton",
        "draftLen": "auto",
        "suffixAutomaton": {"globalPool": True, "globalPoolSize": 256},
    },
    "pard": {
        "method": "pard",
        "maxDraftLen": 8,
        "pard": {"model": {"uri": "hf://amd/PARD-Llama-3.2-1B"}},
    },
    "pard-with-suffix-automaton": {
        "method": "pard",
        "maxDraftLen": 8,
        "pard": {"model": {"uri": "hf://amd/PARD-Llama-3.2-1B", "credentialsSecret": "hf-token"}},
        "suffixAutomaton": {"threshold": 6},
    },
    "dflash": {
        "method": "dflash",
        "maxDraftLen": 16,
        "dflash": {
            "model": {"uri": "pvc://model-store/llama-3.1-8b-dflash"},
            "maskTokenId": 128002,
            "targetLayerIds": [1, 8, 15, 22, 29],
        },
    },
    "eagle3-with-suffix-automaton": {
        "method": "eagle3",
        "maxDraftLen": 3,
        "eagle": {"model": {"uri": "hf://yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"}},
        "suffixAutomaton": {},
    },
}


def _rendered(speculative: dict[str, Any]) -> str:
    body = yaml.safe_load(BASE.read_text())
    body = copy.deepcopy(body)
    body["metadata"]["name"] = "llama-8b-method"
    del body["spec"]["draft"]
    body["spec"]["speculative"] = speculative
    sdep = parse_object(body)
    assert isinstance(sdep, SpeculativeDeployment)
    children = render_children(sdep, OperatorSettings())
    config = next(c for c in children if c["kind"] == "ConfigMap")
    deployment = next(c for c in children if c["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    fetched = {
        "initContainers": [
            {"name": c["name"], "command": [_short(word) for word in c.get("command") or []]}
            for c in pod.get("initContainers", [])
        ],
        "image": pod["containers"][0]["image"],
    }
    server_config = json.loads(config["data"]["server.yaml"])
    assert ServerConfig.model_validate(server_config).method == speculative["method"]  # the contract
    return dump_yaml([fetched, server_config])


def _short(word: str) -> str:
    """A shell script's text is the fetch script's or the cache check's (their own tests hold them)."""
    return f"<script of {len(word.splitlines())} lines>" if "\n" in word or len(word) > 160 else word


@pytest.mark.parametrize("name", sorted(METHODS))
def test_each_method_renders_its_golden_pod_and_server_config(name: str) -> None:
    golden = GOLDEN / f"{name}.yaml"
    rendered = _rendered(METHODS[name])
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(rendered)
    assert golden.is_file(), f"no golden file {golden}; run with SPECDEPLOY_UPDATE_GOLDEN=1"
    assert rendered == golden.read_text(), (
        f"method {name} renders differently from {golden}; if intended, regenerate with "
        "SPECDEPLOY_UPDATE_GOLDEN=1 and review the diff"
    )


def test_no_stale_method_golden_files() -> None:
    assert sorted(p.stem for p in GOLDEN.glob("*.yaml")) == sorted(METHODS)
