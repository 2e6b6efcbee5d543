"""Contract: the server configuration the operator renders loads with the server's own model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.builders import OperatorSettings, render_children

# The test environment installs both packages (make venv): this contract must never be skipped.
from specdeploy_server import config

from tests.example_files import example_files, example_id

EXAMPLES = example_files()


@pytest.mark.parametrize("example", EXAMPLES, ids=[example_id(path) for path in EXAMPLES])
def test_rendered_server_config_loads(example: Path) -> None:
    for body in yaml.safe_load_all(example.read_text()):
        if not body or body.get("kind") != "SpeculativeDeployment":
            continue
        sdep = parse_object(body)
        assert isinstance(sdep, SpeculativeDeployment)
        children = render_children(sdep, OperatorSettings())
        configmap = next(child for child in children if child["kind"] == "ConfigMap")
        data = configmap["data"]["server.yaml"]
        assert json.loads(data) == yaml.safe_load(data)  # JSON text, valid YAML: the server reads either
        loaded = config.ServerConfig.model_validate(json.loads(data))
        assert loaded.serving.port == sdep.spec.serving.port
        if sdep.spec.speculative.method in ("draftTarget", "promptLookup", "none"):
            assert loaded.method == sdep.spec.speculative.method
        if sdep.spec.placement.device == "cpu":
            assert (loaded.placement.device, loaded.backend) == ("cpu", "pytorch-reference")
            assert loaded.placement.cpu_threads is not None
            assert loaded.placement.cpu_threads >= 1
            continue
        assert loaded.placement.device == "cuda"
        target_ids, draft_ids = loaded.placement.target_device_ids, loaded.placement.draft_device_ids
        assert len(target_ids) == sdep.spec.target.gpus
        if sdep.spec.draft is not None:
            assert len(draft_ids) == sdep.spec.draft.tensor_parallel
