"""The CRDs in a real kube-apiserver.

Every example is accepted; every invalid manifest of the shared case table is rejected at admission with a
message that names the field; defaults agree with the pydantic models; the status and scale subresources,
printer columns and short names work."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_operator.api import EngineBuild, SpeculativeDeployment, parse_object

from tests.conftest import Kubectl
from tests.example_files import example_files, example_id
from tests.unit.api_cases import BASES, INVALID_CASES, Case

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("install_crds")]

EXAMPLES = example_files()


def get_json(kubectl: Kubectl, *args: str) -> Any:
    return json.loads(kubectl("get", *args, "-o", "json").stdout)


def create(kubectl: Kubectl, namespace: str, doc: dict[str, Any], *extra: str) -> Any:
    return kubectl(
        "create", "--validate=strict", "-n", namespace, "-f", "-", *extra, input=json.dumps(doc), check=False
    )


@pytest.mark.parametrize("example", EXAMPLES, ids=example_id)
def test_example_is_accepted_with_the_models_defaults(
    kubectl: Kubectl, namespace: str, example: Path
) -> None:
    dry_run = kubectl("apply", "--server-side", "--dry-run=server", "-n", namespace, "-f", str(example))
    assert "serverside-applied (server dry run)" in dry_run.stdout
    kubectl("create", "--validate=strict", "-n", namespace, "-f", str(example))
    doc = yaml.safe_load(example.read_text())
    stored = get_json(kubectl, "speculativedeployment", doc["metadata"]["name"], "-n", namespace)
    parsed = parse_object(doc)
    assert isinstance(parsed, SpeculativeDeployment)
    # The apiserver's defaulting (and pruning of explicit nulls) gives exactly what the models give offline.
    assert stored["spec"] == parsed.spec.to_dict()


def server_side_apply(kubectl: Kubectl, namespace: str, doc: dict[str, Any], *extra: str) -> Any:
    return kubectl(
        "apply", "--server-side", "--validate=strict", "-n", namespace, "-f", "-", *extra,
        input=json.dumps(doc), check=False,
    )  # fmt: skip


@pytest.mark.parametrize("case", INVALID_CASES, ids=lambda case: case.id)
def test_invalid_manifest_is_rejected_naming_the_field(kubectl: Kubectl, case: Case) -> None:
    """Both ways of writing an object (POST, and server-side apply) refuse it, naming the field.

    Server-side dry run: admission runs in full and nothing is stored, so one namespace serves every case."""
    results = [server_side_apply(kubectl, "default", case.manifest(), "--dry-run=server")]
    if not case.server_side_apply_only:
        results.append(create(kubectl, "default", case.manifest(), "--dry-run=server"))
    for result in results:
        assert result.returncode != 0, f"accepted: {result.stdout}"
        assert "created" not in result.stdout
        assert "applied" not in result.stdout
        assert case.path in result.stderr, result.stderr
        if case.message is not None:
            assert case.message in result.stderr, result.stderr


def test_unknown_fields_are_rejected_not_pruned(kubectl: Kubectl, namespace: str) -> None:
    doc = BASES["none"] | {"metadata": {"name": "typo"}}
    doc = json.loads(json.dumps(doc))
    doc["spec"]["placement"] = {"gpuProducts": "NVIDIA-H200"}
    result = create(kubectl, namespace, doc)
    assert result.returncode != 0
    assert 'unknown field "spec.placement.gpuProducts"' in result.stderr


def test_status_and_scale_subresources(kubectl: Kubectl, namespace: str) -> None:
    doc = yaml.safe_load(EXAMPLES[0].read_text())
    name = doc["metadata"]["name"]
    doc["status"] = {"phase": "Ready"}
    assert create(kubectl, namespace, doc).returncode == 0
    stored = get_json(kubectl, "sdep", name, "-n", namespace)
    assert "status" not in stored, "status must only be written through the status subresource"

    kubectl("scale", "sdep", name, "-n", namespace, "--replicas=3")
    assert get_json(kubectl, "sdep", name, "-n", namespace)["spec"]["replicas"] == 3

    status = {
        "phase": "Degraded",
        "observedGeneration": 2,
        "replicas": 3,
        "readyReplicas": 2,
        "readyText": "2/3",
        "selector": f"specdeploy.dev/name={name}",
        "gpusPerReplica": 2,
        "endpoint": f"http://{name}.{namespace}.svc:8000/v1",
        "modelName": "meta-llama/Llama-3.3-70B-Instruct",
        "conditions": [
            {
                "type": "Available",
                "status": "False",
                "observedGeneration": 2,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
                "reason": "ReplicasNotReady",
                "message": "2 of 3 replicas ready",
            }
        ],
    }
    kubectl(
        "patch", "sdep", name, "-n", namespace, "--subresource=status", "--type=merge", "-p",
        json.dumps({"status": status}),
    )  # fmt: skip
    stored = get_json(kubectl, "sdep", name, "-n", namespace)
    assert stored["status"] == status
    parsed = parse_object(stored)
    assert isinstance(parsed, SpeculativeDeployment)

    scale = json.loads(
        kubectl(
            "get",
            "--raw",
            f"/apis/specdeploy.dev/v1alpha1/namespaces/{namespace}/speculativedeployments/{name}/scale",
        ).stdout
    )
    assert scale["spec"]["replicas"] == 3
    assert scale["status"] == {"replicas": 3, "selector": f"specdeploy.dev/name={name}"}

    table = kubectl("get", "sdep", name, "-n", namespace, "-o", "wide").stdout.splitlines()
    assert table[0].split() == [
        "NAME", "PHASE", "METHOD", "TARGET", "DRAFT", "READY", "ACCEPTANCE", "TOKENS/STEP", "GPUS/REPLICA",
        "AGE", "BACKEND", "ENDPOINT", "MODEL", "NODES/REPLICA",
    ]  # fmt: skip
    row = table[1].split()
    assert row[:7] == [
        name,
        "Degraded",
        "draftTarget",
        "hf://meta-llama/Llama-3.3-70B-Instruct",
        "hf://meta-llama/Llama-3.1-8B-Instruct",
        "2/3",
        "2",
    ]

    bad = kubectl(
        "patch", "sdep", name, "-n", namespace, "--subresource=status", "--type=merge", "-p",
        json.dumps({"status": {"phase": "Running"}}), check=False,
    )  # fmt: skip
    assert bad.returncode != 0
    assert "status.phase" in bad.stderr


def test_short_names(kubectl: Kubectl, namespace: str) -> None:
    for name in ("sdep", "specdeploy", "speculativedeployments", "eb", "enginebuilds"):
        kubectl("get", name, "-n", namespace)


def engine_build_manifest() -> dict[str, Any]:
    return {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "EngineBuild",
        "metadata": {"name": "llama-3-3-70b-target-0123456789abcdef"},
        "spec": {
            "model": {"uri": "hf://meta-llama/Llama-3.3-70B-Instruct"},
            "role": "target",
            "parallelism": {"tensorParallel": 2},
            "quantization": {"format": "fp8", "kvCacheDtype": "fp8"},
            "buildFlags": ["--max_batch_size", "128", "--use_paged_context_fmha", "enable"],
            "hash": "0123456789abcdef",
            "builderImage": "nvcr.io/nvidia/tensorrt-llm/release:0.15.0",
            "gpuProduct": "NVIDIA-H100-80GB-HBM3",
            "cache": {"pvcName": "engine-cache", "path": "engines/0123456789abcdef"},
        },
    }


def test_engine_build(kubectl: Kubectl, namespace: str) -> None:
    doc = engine_build_manifest()
    name = doc["metadata"]["name"]
    assert create(kubectl, namespace, doc).returncode == 0
    stored = get_json(kubectl, "eb", name, "-n", namespace)
    parsed = parse_object(doc)
    assert isinstance(parsed, EngineBuild)
    assert stored["spec"] == parsed.spec.to_dict()

    kubectl(
        "patch", "eb", name, "-n", namespace, "--subresource=status", "--type=merge", "-p",
        json.dumps({"status": {"phase": "Running", "jobName": f"{name}-build", "attempts": 1}}),
    )  # fmt: skip
    table = kubectl("get", "eb", name, "-n", namespace).stdout.splitlines()
    assert table[0].split() == ["NAME", "MODEL", "ROLE", "TP", "PHASE", "AGE"]
    assert table[1].split()[:5] == [name, "hf://meta-llama/Llama-3.3-70B-Instruct", "target", "2", "Running"]

    changed = kubectl(
        "patch", "eb", name, "-n", namespace, "--type=merge", "-p",
        json.dumps({"spec": {"buildFlags": ["--max_batch_size", "64"]}}), check=False,
    )  # fmt: skip
    assert changed.returncode != 0
    assert "spec.hash" in changed.stderr
    assert "spec is immutable" in changed.stderr


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"role": "verifier"}, "spec.role"),
        ({"hash": "NOT-A-HASH"}, "spec.hash"),
        ({"model": {"uri": "http://example.com/model"}}, "spec.model.uri"),
        ({"parallelism": {"tensorParallel": 0}}, "spec.parallelism.tensorParallel"),
        ({"cache": {"pvcName": "engine-cache"}}, "spec.cache.path"),
    ],
)
def test_invalid_engine_build_is_rejected(kubectl: Kubectl, patch: dict[str, Any], path: str) -> None:
    doc = engine_build_manifest()
    doc["spec"].update(patch)
    result = create(kubectl, "default", doc, "--dry-run=server")
    assert result.returncode != 0
    assert path in result.stderr, result.stderr
