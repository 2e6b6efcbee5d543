"""Contract: the server configuration the operator renders loads with the server's own model."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
import yaml
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.api.spec import SERVER_DEFAULT_MAX_BATCH_SIZE
from specdeploy_operator.builders import OperatorSettings, build_engine_builds, render_children
from specdeploy_operator.builders.job import HF_QUANTIZE_COMMAND, build_commands

# The test environment installs both packages (make venv): this contract must never be skipped.
from specdeploy_server import config, quantize

from tests.example_files import example_files, example_id

EXAMPLES = example_files()
REPO = Path(__file__).resolve().parents[2]


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


def test_checkpoint_jobs_on_the_maintained_path_call_the_servers_quantize_command_as_it_parses() -> None:
    """The operator renders `specdeploy-quantize` (builders/job.py); the server package declares that console
    script, and the rendered arguments parse as the script reads them."""
    scripts = tomllib.loads((REPO / "server" / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts[HF_QUANTIZE_COMMAND] == "specdeploy_server.quantize:main"
    rendered = 0
    for example in EXAMPLES:
        sdep = parse_object(yaml.safe_load(example.read_text()))
        assert isinstance(sdep, SpeculativeDeployment)
        for engine in build_engine_builds(sdep, OperatorSettings()):
            commands = build_commands(engine, OperatorSettings())
            if commands.checkpoint is None or commands.checkpoint[0] != HF_QUANTIZE_COMMAND:
                continue
            assert sdep.spec.backend == "pytorch"
            args = quantize.parse_args(commands.checkpoint[1:])
            model = sdep.spec.target if engine["spec"]["role"] == "target" else sdep.spec.draft
            assert model is not None
            wanted = model.quantization
            assert (args.qformat, args.kv_cache_dtype, args.calib_size, args.dtype) == (
                wanted.format,
                wanted.kv_cache_dtype,
                wanted.calib_size,
                wanted.dtype,
            )
            assert str(args.output_dir) == commands.engine_dir
            rendered += 1
    assert rendered >= 6


def test_the_batch_size_the_operator_assumes_unset_is_the_servers_default() -> None:
    assert config.RuntimeConfig().max_batch_size == SERVER_DEFAULT_MAX_BATCH_SIZE
