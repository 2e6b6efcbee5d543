"""docs/gpu-cluster.md, the walkthrough from an empty GPU cluster: every command of its shell blocks is
accounted for here (run by a test, the README's own command and so run by the README's tests, or not runnable
here, with the reason), its manifests validate, and the commands that can run on the local cluster do."""

from __future__ import annotations

import contextlib
import re
import subprocess
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.builders import OperatorSettings, build_job, engine_builds

from tests.conftest import OPERATOR_NAMESPACE_PREFIX, Kubectl
from tests.docs.mdshell import commands, fenced_blocks
from tests.docs.readme_rows import readme_commands
from tests.docs.readme_shell import Shell, wait_for_text

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "gpu-cluster.md"

README = "the README's command, run (or explained) by the README's tests (tests/docs/readme_rows.py)"
NEEDS_GPUS = "needs real GPU nodes and NVIDIA's charts from the network (the local cluster's GPUs are kwok's)"
NEEDS_NETWORK = "downloads from outside this machine, which the tests never reach"
NEEDS_DOCKER = (
    "no Docker engine and no registry here (tests/chart/test_dockerfiles.py checks the Dockerfiles)"
)
NEEDS_GPU_SERVER = (
    "calls the model, which only a GPU serves: the local cluster's GPU pods are kwok's and run no server "
    "(the README's served-for-real steps run the same calls on CPU pods)"
)
HELM_INSTALL = (
    "helm install specdeploy charts/specdeploy -n specdeploy-system --create-namespace"
    " --set image.repository=registry.example.com/specdeploy/operator"
    " --set settings.serverImage.repository=registry.example.com/specdeploy/server"
    " --set settings.engineServerImage.repository=registry.example.com/specdeploy/server"
    " --set engineCache.storageClassName=efs-rwx"
    " --set 'imagePullSecrets={regcred}'"
    " --set 'managedPods.imagePullSecrets={regcred}'"
)
WALK = "test_the_walkthrough_runs_in_order_up_to_the_gpu_steps"
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
    "kubectl create namespace llm": WALK,
    "kubectl create namespace specdeploy-system": WALK,
    (
        "kubectl create secret docker-registry regcred -n llm --docker-server=registry.example.com"
        ' --docker-username=robot --docker-password="$REGISTRY_TOKEN"'
    ): WALK,
    (
        "kubectl create secret docker-registry regcred -n specdeploy-system"
        ' --docker-server=registry.example.com --docker-username=robot --docker-password="$REGISTRY_TOKEN"'
    ): WALK,
    "docker build -f Dockerfile.operator -t registry.example.com/specdeploy/operator:0.1.0 .": README,
    "hack/build-server-images.sh registry.example.com/specdeploy/server": README,
    "docker push registry.example.com/specdeploy/operator:0.1.0": README,
    "docker push registry.example.com/specdeploy/server:0.1.0": README,
    "docker push registry.example.com/specdeploy/server:0.1.0-trtllm1.2.1": README,
    HELM_INSTALL: WALK,
    "kubectl -n specdeploy-system rollout status deployment/specdeploy": WALK,
    "kubectl create secret generic hf-token -n llm --from-literal=HF_TOKEN=hf_your_token_here": WALK,
    "kubectl apply -n llm -f llama-8b-1b.yaml": WALK,
    "kubectl get sdep -n llm -w": WALK,
    "kubectl get enginebuilds -n llm": WALK,
    "kubectl describe enginebuild -n llm": WALK,
    "kubectl port-forward -n llm svc/llama-8b-1b-h100 8000:8000 &": NEEDS_GPU_SERVER,
    (
        "curl -s localhost:8000/v1/completions -H 'Content-Type: application/json'"
        """ -d '{"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "Speculative decoding","""
        """ "max_tokens": 24}'"""
    ): NEEDS_GPU_SERVER,
    "kubectl delete sdep --all -n llm": WALK,
    "kubectl delete enginebuilds --all -n llm": WALK,
    "helm uninstall specdeploy -n specdeploy-system": WALK,
    "kubectl delete namespace llm": WALK,
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


def _run(command: str, env: dict[str, str], subs: dict[str, str]) -> str:
    """A command of the page as written, in namespaces of this test (`subs`), in the repository root."""
    assert command in _commands(), command
    for old, new in subs.items():
        command = re.sub(old, new, command)
    proc = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{command}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, f"`{command}` failed:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.mark.integration
@pytest.mark.usefixtures("operator", "install_crds")
def test_the_walkthrough_runs_in_order_up_to_the_gpu_steps(
    cluster_shell: Shell, api_client: client.ApiClient, tmp_path: Path
) -> None:
    """Every command of the page that the local cluster can play, in the page's order: the namespaces and
    pull Secrets, the chart (its operator pod pulling with `regcred`), the token, step 7's deployment built
    and Ready under `kubectl get -w` (each build Job: download, quantize, complete, as step 8 says), the
    EngineBuilds described, then the teardown. `llm` is a namespace the session's operator watches; the
    chart's own operator pod is kwok's."""
    core, apps, batch = (
        client.CoreV1Api(api_client),
        client.AppsV1Api(api_client),
        client.BatchV1Api(api_client),
    )
    suffix = uuid.uuid4().hex[:8]
    llm, system = f"{OPERATOR_NAMESPACE_PREFIX}-llm-{suffix}", f"walk-system-{suffix}"
    manifest = tmp_path / "llama-8b-1b.yaml"
    [body] = [d for d in _manifests() if d["kind"] == "SpeculativeDeployment"]
    manifest.write_text(yaml.safe_dump(body))
    subs = {r"\bllm\b": llm, "specdeploy-system": system, r"llama-8b-1b\.yaml": str(manifest)}
    env = {**cluster_shell.env, "REGISTRY_TOKEN": "not-a-real-token"}

    def operator_pulls_with_regcred(_: str) -> None:
        pod = apps.read_namespaced_deployment("specdeploy", system).spec.template.spec
        assert [s.name for s in pod.image_pull_secrets or []] == ["regcred"]
        env_vars = {e.name: e.value for e in pod.containers[0].env}
        assert env_vars["SPECDEPLOY_IMAGE_PULL_SECRETS"] == "regcred"

    def jobs_are_download_quantize_complete(watched: str) -> None:
        assert watched.splitlines()[0].split()[:2] == ["NAME", "PHASE"], watched
        jobs = batch.list_namespaced_job(llm).items
        assert len(jobs) == 2, [j.metadata.name for j in jobs]
        for job in jobs:
            pod = job.spec.template.spec
            steps = [c.name for c in [*(pod.init_containers or []), *pod.containers]]
            assert steps == ["download", "quantize", "complete"], steps

    def listed(text: str) -> None:
        header, *rows = text.splitlines()
        assert {"ROLE", "PHASE"} <= set(header.split()), text
        assert len(rows) == 2, text
        assert all("Succeeded" in row.split() for row in rows), text

    def described(text: str) -> None:
        assert text.count("Succeeded") >= 2, text
        assert "Role:" in text, text

    expected: dict[str, Callable[[str], None]] = {
        "kubectl create namespace llm": lambda out: _equals(out, f"namespace/{llm} created"),
        HELM_INSTALL: lambda out: _contains(out, "STATUS: deployed"),
        "kubectl -n specdeploy-system rollout status deployment/specdeploy": operator_pulls_with_regcred,
        "kubectl create secret generic hf-token -n llm --from-literal=HF_TOKEN=hf_your_token_here": (
            lambda out: _equals(out, "secret/hf-token created")
        ),
        "kubectl apply -n llm -f llama-8b-1b.yaml": lambda out: _equals(
            out, "speculativedeployment.specdeploy.dev/llama-8b-1b-h100 created"
        ),
        "kubectl get sdep -n llm -w": jobs_are_download_quantize_complete,
        "kubectl get enginebuilds -n llm": listed,
        "kubectl describe enginebuild -n llm": described,
        "helm uninstall specdeploy -n specdeploy-system": lambda out: _contains(out, "uninstalled"),
        "kubectl delete namespace llm": lambda out: _equals(out, f'namespace "{llm}" deleted'),
    }
    watch: subprocess.Popen[bytes] | None = None
    try:
        for command in [c for c in _commands() if ROWS[c] == WALK]:
            if command.endswith(" -w"):
                log = tmp_path / "watch.log"
                with log.open("wb") as out:
                    watch = subprocess.Popen(
                        ["bash", "-c", re.sub(r"\bllm\b", llm, command)],
                        cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                    )  # fmt: skip
                output = wait_for_text(log, r"^llama-8b-1b-h100\s+Ready\b", watch, timeout=240)
                cluster_shell.stop(watch)
            else:
                output = _run(command, env, subs)
            if command in expected:
                expected[command](output)
    finally:
        if watch is not None:
            cluster_shell.stop(watch)
        subprocess.run(
            ["helm", "uninstall", "specdeploy", "-n", system], env=env, capture_output=True, check=False
        )
        for namespace in (llm, system):
            with contextlib.suppress(client.ApiException):
                core.delete_namespace(namespace)


def _equals(output: str, wanted: str) -> None:
    assert output.strip() == wanted, output


def _contains(output: str, wanted: str) -> None:
    assert wanted in output, output
