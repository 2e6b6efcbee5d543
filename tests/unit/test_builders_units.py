"""Targeted builder tests: device placement, GPU counts, engine hash stability."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from specdeploy_operator.builders import (
    build_deployment,
    build_engine_builds,
    build_job,
    build_server_config,
    device_placement,
)

from tests.unit.builder_examples import (
    COLOCATED,
    DEDICATED,
    SETTINGS,
    deployment_of,
    engine_hashes,
    example_body,
    gpus_of,
    parsed_example,
)

# --- device placement and GPU counts ------------------------------------------------------------------------


def test_colocated_draft_uses_the_first_draft_tp_target_devices() -> None:
    body = example_body(COLOCATED)
    body["spec"]["target"]["tensorParallel"] = 4
    body["spec"]["target"]["quantization"]["kvCacheDtype"] = "fp8"
    sdep = parsed_example(body)
    assert device_placement(sdep) == ([0, 1, 2, 3], [0, 1])
    config = build_server_config(sdep, build_engine_builds(sdep, SETTINGS), SETTINGS)
    assert config["placement"] == {
        "device": "cuda",
        "targetDeviceIds": [0, 1, 2, 3],
        "draftDeviceIds": [0, 1],
    }
    assert gpus_of(build_deployment(sdep, build_engine_builds(sdep, SETTINGS), SETTINGS)) == "4"


def test_seed_000_colocated_two_gpus() -> None:
    sdep = parsed_example(example_body(COLOCATED))
    assert device_placement(sdep) == ([0, 1], [0, 1])
    assert gpus_of(build_deployment(sdep, build_engine_builds(sdep, SETTINGS), SETTINGS)) == "2"


def test_dedicated_draft_takes_the_devices_after_the_target() -> None:
    sdep = parsed_example(example_body(DEDICATED))
    assert device_placement(sdep) == ([0], [1])
    assert gpus_of(build_deployment(sdep, build_engine_builds(sdep, SETTINGS), SETTINGS)) == "2"
    body = example_body(COLOCATED)
    body["spec"]["placement"]["draft"] = "dedicated"
    sdep = parsed_example(body)
    assert device_placement(sdep) == ([0, 1], [2, 3])
    assert gpus_of(build_deployment(sdep, build_engine_builds(sdep, SETTINGS), SETTINGS)) == "4"


def test_no_draft_has_no_draft_devices() -> None:
    sdep = parsed_example(example_body("05-prompt-lookup-llama13b"))
    assert device_placement(sdep) == ([0], None)
    config = build_server_config(sdep, build_engine_builds(sdep, SETTINGS), SETTINGS)
    assert "draftDeviceIds" not in config["placement"]
    assert "draft" not in config["model"]


def test_job_requests_tp_times_pp_gpus_on_the_gpu_product() -> None:
    body = example_body("tensorrt/04a-draft-target-llama405b-1b-4xh200")
    sdep = parsed_example(body)
    for engine in build_engine_builds(sdep, SETTINGS):
        job = build_job(engine, SETTINGS)
        pod = job["spec"]["template"]["spec"]
        tp = (
            engine["spec"]["parallelism"]["tensorParallel"]
            * engine["spec"]["parallelism"]["pipelineParallel"]
        )
        gpu_steps = [c for c in pod["initContainers"] if c["name"] in ("quantize", "convert", "build")]
        assert gpu_steps
        for step in gpu_steps:
            assert step["resources"]["limits"] == {"nvidia.com/gpu": str(tp)}
        assert pod["nodeSelector"] == {"nvidia.com/gpu.product": sdep.spec.placement.gpu_product}
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
        assert pod["restartPolicy"] == "Never"
        assert job["spec"]["backoffLimit"] == SETTINGS.build_backoff_limit
        assert job["spec"]["ttlSecondsAfterFinished"] == SETTINGS.build_ttl_seconds
        build = next(c for c in pod["initContainers"] if c["name"] == "build")["command"]
        assert build[build.index("--workers") + 1] == str(engine["spec"]["parallelism"]["tensorParallel"])
        assert job["metadata"]["ownerReferences"][0]["kind"] == "EngineBuild"


def test_deployment_scheduling_and_volumes() -> None:
    sdep = parsed_example(example_body(COLOCATED))
    engines = build_engine_builds(sdep, SETTINGS)
    deployment = build_deployment(sdep, engines, SETTINGS)
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["engine-cache"]["persistentVolumeClaim"]["readOnly"] is True
    mounts = {m["name"]: m for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["engine-cache"]["readOnly"] is True
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    container = pod["containers"][0]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health/live"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= SETTINGS.startup_timeout_seconds
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert pod["terminationGracePeriodSeconds"] == SETTINGS.termination_grace_period_seconds
    annotation = spec["template"]["metadata"]["annotations"]["specdeploy.dev/engine-hashes"]
    assert annotation == ",".join(f"{e['spec']['role']}={e['spec']['hash']}" for e in engines)


def test_rollout_limits_come_from_the_spec() -> None:
    body = example_body(COLOCATED)
    body["spec"]["rollout"] = {"maxSurge": "25%", "maxUnavailable": 0}
    deployment = deployment_of(parsed_example(body))
    assert deployment["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": "25%", "maxUnavailable": 0}


# --- engine hashes ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.__setitem__("replicas", 5),
        lambda s: s.__setitem__("runtime", {"maxBatchSize": 8, "kvCacheFreeGpuMemFraction": 0.3}),
        lambda s: s.__setitem__("serving", {"port": 9000}),
        lambda s: s.__setitem__("rollout", {"maxSurge": 1, "maxUnavailable": 0}),
        lambda s: s["placement"].__setitem__("tolerations", []),
        lambda s: s["placement"].__setitem__("nodeSelector", {"pool": "a"}),
        lambda s: s["speculative"].__setitem__("draftLen", 4),
        lambda s: s["target"]["model"].__setitem__("credentialsSecret", "hf-token"),
    ],
    ids=[
        "replicas",
        "runtime",
        "serving",
        "rollout",
        "tolerations",
        "nodeSelector",
        "draftLen",
        "credentials",
    ],
)
def test_engine_hashes_ignore_serving_only_changes(change: Any) -> None:
    body = example_body(COLOCATED)
    before = engine_hashes(body)
    change(body["spec"])
    assert engine_hashes(body) == before


def test_quantization_format_changes_the_hash() -> None:
    body = example_body(DEDICATED)
    before = engine_hashes(body)
    body["spec"]["target"]["quantization"]["format"] = "fp8"
    after = engine_hashes(body)
    assert after["target"] != before["target"]
    assert after["draft"] == before["draft"]


def test_max_draft_len_changes_only_the_target_hash() -> None:
    body = example_body(COLOCATED)
    before = engine_hashes(body)
    body["spec"]["speculative"]["maxDraftLen"] = 8
    after = engine_hashes(body)
    assert after["target"] != before["target"]
    assert after["draft"] == before["draft"]


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s["placement"].__setitem__("gpuProduct", "NVIDIA-H200"),
        lambda s: s.__setitem__("images", {"builder": "registry.example/builder:2"}),
        lambda s: s["target"]["model"].__setitem__("revision", "abc123"),
        lambda s: s["target"]["build"].__setitem__("maxBatchSize", 64),
    ],
    ids=["gpuProduct", "builderImage", "revision", "buildFlag"],
)
def test_engine_inputs_change_the_target_hash(change: Any) -> None:
    body = example_body(COLOCATED)
    before = engine_hashes(body)
    change(body["spec"])
    assert engine_hashes(body)["target"] != before["target"]


def test_two_deployments_share_the_target_engine() -> None:
    first = example_body(COLOCATED)
    second = copy.deepcopy(first)
    second["metadata"]["name"] = "another"
    second["spec"]["replicas"] = 3
    names = [
        [e["metadata"]["name"] for e in build_engine_builds(parsed_example(b), SETTINGS)]
        for b in (first, second)
    ]
    assert names[0] == names[1]


def test_pytorch_builds_only_for_quantization() -> None:
    body = example_body("06-eagle3-pytorch-tp8")
    assert build_engine_builds(parsed_example(body), SETTINGS) == []
    # With quantization the API admits it and the Job produces a quantized checkpoint (no trtllm-build).
    body["spec"]["target"]["quantization"] = {"format": "fp8"}
    sdep = parsed_example(body)
    engines = build_engine_builds(sdep, SETTINGS)
    assert len(engines) == 1
    assert engines[0]["spec"]["buildFlags"] == []
    pod = build_job(engines[0], SETTINGS)["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["initContainers"]] == ["quantize"]  # pvc:// source: mounted, no download
    config = build_server_config(sdep, engines, SETTINGS)
    assert config["model"]["target"] == f"/cache/engines/{engines[0]['spec']['hash']}"
