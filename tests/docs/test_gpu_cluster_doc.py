"""docs/gpu-cluster.md, the walkthrough from an empty GPU cluster: every command of its shell blocks is
accounted for here (run by a test, the README's own command and so run by the README's tests, or not runnable
here, with the reason), its manifests validate, and the commands that can run on the local cluster do."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.builders import OperatorSettings, build_job, engine_builds

from tests.conftest import Kubectl
from tests.docs.mdshell import commands, fenced_blocks
from tests.docs.readme_rows import readme_commands

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "gpu-cluster.md"

README = "the README's command, run (or explained) by the README's tests (tests/docs/readme_rows.py)"
NEEDS_GPUS = "needs real GPU nodes and NVIDIA's charts from the network (the local cluster's GPUs are kwok's)"
NEEDS_NETWORK = "downloads from outside this machine, which the tests never reach"
NEEDS_DOCKER = (
    "no Docker engine and no registry here (tests/chart/test_dockerfiles.py checks the Dockerfiles)"
)
NAMESPACE_LLM = (
    "a cluster-scoped or namespace-creating step of the walk; the steps it enables run in the tests"
)
ROWS: dict[str, str] = {
    "helm repo add nvidia https://helm.ngc.nvidia.com/nvidia": NEEDS_NETWORK,
    "helm install gpu-operator nvidia/gpu-operator -n gpu-operator --create-namespace --wait": NEEDS_GPUS,
    "helm repo add nvdp https://nvidia.github.io/k8s-device-plugin": NEEDS_NETWORK,
    (
        "helm install nvdp nvdp/nvidia-device-plugin -n nvidia-device-plugin --create-namespace"
        " --set gfd.enabled=true"
    ): NEEDS_GPUS,
    "kubectl get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count": "test_the_node_labels_command",
    "kubectl apply -f efs-rwx.yaml": "needs the EFS CSI driver and a file system (its manifest is checked)",
    "kubectl create namespace llm": NAMESPACE_LLM,
    (
        "kubectl create secret docker-registry regcred -n llm --docker-server=registry.example.com"
        ' --docker-username=robot --docker-password="$REGISTRY_TOKEN"'
    ): "needs a registry and its token",
    "docker build -f Dockerfile.operator -t registry.example.com/specdeploy/operator:0.1.0 .": README,
    "hack/build-server-images.sh registry.example.com/specdeploy/server": README,
    "docker push registry.example.com/specdeploy/operator:0.1.0": README,
    "docker push registry.example.com/specdeploy/server:0.1.0": README,
    "docker push registry.example.com/specdeploy/server:0.1.0-trtllm1.2.1": README,
    (
        "helm install specdeploy charts/specdeploy -n specdeploy-system --create-namespace"
        " --set image.repository=registry.example.com/specdeploy/operator"
        " --set settings.serverImage.repository=registry.example.com/specdeploy/server"
        " --set settings.engineServerImage.repository=registry.example.com/specdeploy/server"
        " --set engineCache.storageClassName=efs-rwx"
        " --set 'managedPods.imagePullSecrets={regcred}'"
    ): "the README's helm install plus one value; tests/chart checks that value reaching the operator",
    "kubectl -n specdeploy-system rollout status deployment/specdeploy": README,
    "kubectl create secret generic hf-token -n llm --from-literal=HF_TOKEN=hf_your_token_here": (
        "the README's command, in namespace llm (test_readme_cluster.py::test_hf_token_secret_command)"
    ),
    "kubectl apply -n llm -f llama-8b-1b.yaml": "test_the_manifest_of_step_7_validates_and_mounts_the_token",
    "kubectl get sdep,enginebuilds -n llm -w": NEEDS_GPUS,
    "kubectl describe enginebuild -n llm": NEEDS_GPUS,
    "kubectl port-forward -n llm svc/llama-8b-1b-h100 8000:8000 &": NEEDS_GPUS,
    (
        "curl -s localhost:8000/v1/completions -H 'Content-Type: application/json'"
        """ -d '{"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "Speculative decoding","""
        """ "max_tokens": 24}'"""
    ): NEEDS_GPUS,
    "kubectl delete sdep --all -n llm": NAMESPACE_LLM,
    "kubectl delete enginebuilds --all -n llm": NAMESPACE_LLM,
    "helm uninstall specdeploy -n specdeploy-system": "the chart's cluster test uninstalls it",
    "kubectl delete namespace llm": NAMESPACE_LLM,
    "helm uninstall gpu-operator -n gpu-operator": NEEDS_GPUS,
}


def _commands() -> list[str]:
    return [c.text for block in fenced_blocks(DOC.read_text()) for c in commands(block)]


def _manifests() -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for block in fenced_blocks(DOC.read_text()):
        if block.language == "yaml":
            docs += [d for d in yaml.safe_load_all("\n".join(block.lines)) if d]
    return docs


def test_every_command_is_accounted_for() -> None:
    found = _commands()
    missing = [c for c in found if c not in ROWS]
    assert not missing, f"commands of {DOC.name} with no row in ROWS: {missing}"
    stale = [c for c in ROWS if c not in found]
    assert not stale, f"rows whose command is not in {DOC.name} any more: {stale}"


def test_rows_that_name_a_test_name_one_of_this_module() -> None:
    """A row is either the name of a test function here that runs or checks the command, or a reason."""
    tests = [why for why in ROWS.values() if why.startswith("test_")]
    assert tests
    assert [t for t in tests if not callable(globals().get(t))] == []


def test_the_commands_said_to_be_the_readmes_are() -> None:
    readme = {f.text for f in readme_commands()}
    shared = [c for c, why in ROWS.items() if why == README]
    assert shared
    assert [c for c in shared if c not in readme] == []


def test_the_manifest_of_step_7_validates_and_mounts_the_token() -> None:
    """The deployment of step 7 is admitted by the models, and its build Jobs mount `hf-token` in their
    download step only."""
    [body] = [d for d in _manifests() if d["kind"] == "SpeculativeDeployment"]
    sdep = parse_object({**body, "metadata": {**body["metadata"], "namespace": "llm"}})
    assert isinstance(sdep, SpeculativeDeployment)
    engines = engine_builds(sdep, OperatorSettings())
    assert [e.spec.role for e in engines] == ["target", "draft"]
    for engine in engines:
        pod = build_job(engine)["spec"]["template"]["spec"]
        [volume] = [v for v in pod["volumes"] if (v.get("secret") or {}).get("secretName") == "hf-token"]
        for step in pod["initContainers"] + pod["containers"]:
            mounted = any(m["name"] == volume["name"] for m in step.get("volumeMounts") or [])
            assert mounted == (step["name"] == "download"), step["name"]


def test_the_storage_class_of_step_2_is_read_write_many_and_owned_by_the_pods_user() -> None:
    from specdeploy_operator.builders.podsecurity import IMAGE_USER

    [storage_class] = [d for d in _manifests() if d["kind"] == "StorageClass"]
    assert storage_class["provisioner"] == "efs.csi.aws.com"
    assert storage_class["parameters"]["uid"] == storage_class["parameters"]["gid"] == str(IMAGE_USER)
    assert "efs-rwx" in " ".join(c for c in _commands() if "storageClassName" in c)


@pytest.mark.integration
def test_the_node_labels_command(kubectl: Kubectl, api_client: client.ApiClient) -> None:
    """Step 1's check, on the local cluster's simulated GPU nodes: it shows each GPU node's product and
    count."""
    command = "kubectl get nodes -L nvidia.com/gpu.product,nvidia.com/gpu.count"
    assert command in _commands()
    out = kubectl(*command.split()[1:]).stdout
    header, *rows = out.splitlines()
    assert header.split()[-2:] == ["GPU.PRODUCT", "GPU.COUNT"], header
    nodes = client.CoreV1Api(api_client).list_node().items
    products = {n.metadata.labels.get("nvidia.com/gpu.product") for n in nodes} - {None}
    assert "NVIDIA-H100-80GB-HBM3" in products
    for product in products:
        assert any(product in row.split() and "8" in row.split() for row in rows), (product, out)
