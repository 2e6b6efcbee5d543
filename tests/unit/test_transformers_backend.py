"""Backend `transformers` and `spec.placement.device: cpu`: the staged checkpoints (EngineBuilds whose Job
only downloads), the CPU form of the serving pods, and the server configuration, held to the server's own
model."""

from __future__ import annotations

import copy
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_operator.api import EngineBuild, SpeculativeDeployment, parse_object
from specdeploy_operator.builders import (
    OperatorSettings,
    build_commands,
    build_deployment,
    build_engine_builds,
    build_job,
    build_server_config,
    cpu_threads,
)
from specdeploy_operator.builders.common import quantity_value
from specdeploy_operator.builders.job import COMPLETION_MARKER, download_step
from specdeploy_operator.controller.status import ServingObservation, deployment_status
from specdeploy_server.config import ServerConfig

from tests.unit.test_controller import NOW, deployment, engine, pod

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CPU_EXAMPLE = EXAMPLES / "09-transformers-cpu-tiny.yaml"
GPU_EXAMPLE = EXAMPLES / "10-transformers-gpu-llama8b-1b.yaml"
SETTINGS = OperatorSettings()


def doc(path: Path) -> dict[str, Any]:
    body: dict[str, Any] = yaml.safe_load(path.read_text())
    return body


def sdep(body: dict[str, Any]) -> SpeculativeDeployment:
    parsed = parse_object(body)
    assert isinstance(parsed, SpeculativeDeployment)
    return parsed


def patched(path: Path, **spec: Any) -> SpeculativeDeployment:
    body = copy.deepcopy(doc(path))
    body["spec"].update(spec)
    return sdep(body)


def pod_spec(deployment_obj: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = deployment_obj["spec"]["template"]["spec"]
    return spec


# -- the CPU form of the serving pods ------------------------------------------------------------------------


def test_cpu_pods_request_no_gpu_anywhere() -> None:
    cpu = sdep(doc(CPU_EXAMPLE))
    assert cpu.spec.gpus_per_replica == 0
    rendered = build_deployment(cpu, build_engine_builds(cpu, SETTINGS), SETTINGS)
    assert "nvidia" not in json.dumps(rendered)
    spec = pod_spec(rendered)
    assert "nodeSelector" not in spec
    assert "tolerations" not in spec
    assert spec["containers"][0]["resources"] == {
        "requests": {"cpu": "500m", "memory": "512Mi"},
        "limits": {"cpu": "1", "memory": "1536Mi"},
    }


def test_cpu_pods_keep_the_users_scheduling() -> None:
    toleration = {"key": "dedicated", "operator": "Equal", "value": "ci", "effect": "NoSchedule"}
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "zone", "operator": "Exists"}]}]
            }
        }
    }
    placement = {"device": "cpu", "nodeSelector": {"pool": "cpu"}, "tolerations": [toleration]}
    cpu = patched(CPU_EXAMPLE, placement={**placement, "affinity": affinity})
    spec = pod_spec(build_deployment(cpu, [], SETTINGS))
    assert spec["nodeSelector"] == {"pool": "cpu"}
    assert spec["tolerations"] == [toleration]
    assert spec["affinity"] == affinity


def test_cpu_pods_without_resources_get_the_operators_defaults() -> None:
    cpu = patched(CPU_EXAMPLE, serving={})
    resources = pod_spec(build_deployment(cpu, [], SETTINGS))["containers"][0]["resources"]
    assert resources == {"limits": {"memory": "2Gi"}, "requests": {"cpu": "1", "memory": "1Gi"}}
    assert build_server_config(cpu, [], SETTINGS)["placement"] == {"device": "cpu", "cpuThreads": 1}

    env = {
        "SPECDEPLOY_CPU_SERVING_CPU_REQUEST": "2500m",
        "SPECDEPLOY_CPU_SERVING_MEMORY_REQUEST": "3Gi",
        "SPECDEPLOY_CPU_SERVING_MEMORY_LIMIT": "4Gi",
    }
    settings = OperatorSettings.from_env(env)
    resources = pod_spec(build_deployment(cpu, [], settings))["containers"][0]["resources"]
    assert resources == {"limits": {"memory": "4Gi"}, "requests": {"cpu": "2500m", "memory": "3Gi"}}
    assert build_server_config(cpu, [], settings)["placement"] == {"device": "cpu", "cpuThreads": 3}


@pytest.mark.parametrize(
    ("resources", "threads"),
    [
        ({"limits": {"cpu": "1"}, "requests": {"cpu": "500m"}}, 1),
        ({"limits": {"cpu": "2500m"}, "requests": {"cpu": 1}}, 3),
        ({"limits": {"memory": "1Gi"}, "requests": {"cpu": 4}}, 4),
        ({"requests": {"cpu": "100m"}}, 1),
        ({"limits": {"memory": "1Gi"}}, 1),
        ({}, 1),
    ],
)
def test_cpu_threads_are_the_cpu_limit_else_request_rounded_up(
    resources: dict[str, Any], threads: int
) -> None:
    assert cpu_threads(resources) == threads


@pytest.mark.parametrize(
    ("quantity", "value"),
    [(2, "2"), ("500m", "0.5"), ("1", "1"), ("1.5", "1.5"), ("2Gi", str(2 * 1024**3)), ("1e3", "1000")],
)
def test_quantity_value(quantity: int | str, value: str) -> None:
    assert quantity_value(quantity) == Decimal(value)


@pytest.mark.parametrize("quantity", ["", "1x", "m", "1 Gi"])
def test_quantity_value_rejects_non_quantities(quantity: str) -> None:
    with pytest.raises(ValueError, match="not a quantity"):
        quantity_value(quantity)


def test_a_cpu_deployment_never_waits_for_gpu_capacity() -> None:
    pending = pod("Pending", scheduled="0/4 nodes are available: 1 Insufficient nvidia.com/gpu.")
    serving = ServingObservation(deployment(1, 2, 2, available=False), True, [pod("Running"), pending])
    status = deployment_status(
        generation=2,
        desired_replicas=2,
        engines=[engine("Succeeded")],
        serving=serving,
        selector="a=b",
        endpoint="http://x.ns.svc:8000/v1",
        gpus_per_replica=0,
        previous=None,
        keep_previous=1,
        now=NOW,
    )
    assert status["gpusPerReplica"] == 0
    assert "capacityPendingReplicas" not in status
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["reason"] == "Unschedulable"
    assert "GPU capacity" not in degraded["message"]


# -- checkpoints: staged (hf://, s3://, gs://) or mounted (pvc://) -------------------------------------------


def test_pvc_checkpoints_are_mounted_into_the_serving_pod_without_an_engine_build() -> None:
    cpu = sdep(doc(CPU_EXAMPLE))
    assert build_engine_builds(cpu, SETTINGS) == []
    spec = pod_spec(build_deployment(cpu, [], SETTINGS))
    assert "initContainers" not in spec
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["name"]: m for m in spec["containers"][0]["volumeMounts"]}
    for role in ("target", "draft"):
        claim = volumes[f"source-{role}"]["persistentVolumeClaim"]
        assert claim == {"claimName": "demo-models", "readOnly": True}
        assert mounts[f"source-{role}"] == {
            "name": f"source-{role}",
            "mountPath": f"/models/source-{role}",
            "readOnly": True,
        }
    model = build_server_config(cpu, [], SETTINGS)["model"]
    assert model == {
        "target": "/models/source-target/target",
        "draft": "/models/source-draft/draft",
        "servedModelName": "target",
    }


def test_remote_checkpoints_are_staged_by_engine_builds_without_gpus() -> None:
    gpu = sdep(doc(GPU_EXAMPLE))
    engines = build_engine_builds(gpu, SETTINGS)
    assert [e["spec"]["role"] for e in engines] == ["target", "draft"]
    for built in engines:
        spec = built["spec"]
        assert spec["stageOnly"] is True
        assert spec["buildFlags"] == []
        assert "gpuProduct" not in spec
        EngineBuild.model_validate({"spec": spec})
        commands = build_commands(built, SETTINGS)
        out_dir = f"/cache/engines/{spec['hash']}"
        assert (commands.checkpoint, commands.build, commands.engine_dir) == (None, None, out_dir)

        job = build_job(built, SETTINGS)
        assert "nvidia" not in json.dumps(job)
        pod_spec_ = job["spec"]["template"]["spec"]
        assert "nodeSelector" not in pod_spec_
        assert "tolerations" not in pod_spec_
        [download] = pod_spec_["initContainers"]
        source = gpu.spec.target if spec["role"] == "target" else gpu.spec.draft
        assert source is not None
        assert download["command"] == download_step(source.model, out_dir)[0]
        assert download["command"][:2] == ["sh", "-c"]  # the fetch script: `hf download` or the older CLI
        assert download["command"][4:6] == ["hf", source.model.uri]
        assert "resources" not in download
        [complete] = pod_spec_["containers"]
        assert complete["name"] == "complete"
        assert complete["command"] == [
            "sh",
            "-c",
            f"set -e; echo {spec['hash']} > {out_dir}/{COMPLETION_MARKER}",
        ]


def test_the_serving_pod_loads_the_staged_checkpoints_from_the_cache() -> None:
    gpu = sdep(doc(GPU_EXAMPLE))
    engines = build_engine_builds(gpu, SETTINGS)
    hashes = {e["spec"]["role"]: e["spec"]["hash"] for e in engines}
    config = build_server_config(gpu, engines, SETTINGS)
    assert config["model"]["target"] == f"/cache/engines/{hashes['target']}"
    assert config["model"]["draft"] == f"/cache/engines/{hashes['draft']}"
    assert "tokenizer" not in config["model"]  # the tokenizer is in the checkpoint directory
    assert config["model"]["maxModelLen"] == 8192
    assert "maxSeqLen" not in config["runtime"]
    spec = pod_spec(build_deployment(gpu, engines, SETTINGS))
    # No download in the pod; only the check that the staged checkpoints are complete.
    assert [c["name"] for c in spec["initContainers"]] == ["verify-engines"]
    assert {"name": "engine-cache", "mountPath": "/cache", "readOnly": True} in spec["containers"][0][
        "volumeMounts"
    ]
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}


def test_a_staged_checkpoint_is_shared_by_gpu_and_cpu_deployments_and_differs_from_builds() -> None:
    gpu = sdep(doc(GPU_EXAMPLE))
    on_cpu = patched(GPU_EXAMPLE, placement={"device": "cpu"}, serving={})
    staged = {e["metadata"]["name"] for e in build_engine_builds(gpu, SETTINGS)}
    assert staged == {e["metadata"]["name"] for e in build_engine_builds(on_cpu, SETTINGS)}

    body = copy.deepcopy(doc(GPU_EXAMPLE))
    body["spec"]["backend"] = "pytorch"
    for role in ("target", "draft"):
        body["spec"][role]["quantization"] = {"format": "fp8", "kvCacheDtype": "fp8"}
    del body["spec"]["runtime"]["maxSeqLen"]
    built = {e["spec"]["hash"] for e in build_engine_builds(sdep(body), SETTINGS)}
    assert len(built) == 2
    assert built.isdisjoint(e["spec"]["hash"] for e in build_engine_builds(gpu, SETTINGS))


# -- the server configuration, held to the server's own model ------------------------------------------------


@pytest.mark.parametrize("device", ["cpu", "gpu"])
@pytest.mark.parametrize("method", ["draftTarget", "promptLookup", "none"])
@pytest.mark.parametrize("example", [CPU_EXAMPLE, GPU_EXAMPLE], ids=["pvc", "hf"])
def test_server_config_of_every_method_loads_in_the_server(device: str, method: str, example: Path) -> None:
    body = copy.deepcopy(doc(example))
    spec = body["spec"]
    spec["speculative"] = {"method": method, "maxDraftLen": 8}
    if method != "draftTarget":
        del spec["draft"]
    spec["placement"] = {"device": device}
    spec["runtime"] = {"maxSeqLen": 1024}
    deployment_ = sdep(body)
    config = build_server_config(deployment_, build_engine_builds(deployment_, SETTINGS), SETTINGS)
    loaded = ServerConfig.model_validate(config)
    assert loaded.backend == "pytorch-reference"
    assert loaded.method == method
    assert loaded.model.max_model_len == 1024
    assert (loaded.model.draft is not None) == (method == "draftTarget")
    if device == "cpu":
        assert loaded.placement.device == "cpu"
        assert loaded.placement.cpu_threads is not None
        assert loaded.placement.cpu_threads >= 1
    else:
        assert loaded.placement.device == "cuda"
        assert loaded.placement.target_device_ids == [0]
