"""The engine workflow's deprecation, on a real kube-apiserver: choosing `spec.backend: tensorrt` is admitted
with a warning `kubectl apply` prints (the ValidatingAdmissionPolicy in crds/), and a deployment stored before
the default became `pytorch` keeps its backend."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from specdeploy_operator.api.spec import TENSORRT_BACKEND_WARNING

from tests.conftest import CRDS, Kubectl, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("install_crds")]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TENSORRT = EXAMPLES / "tensorrt" / "02-draft-target-llama8b-1b-h100.yaml"
PYTORCH = EXAMPLES / "06-eagle3-pytorch-tp8.yaml"
CRD = CRDS / "specdeploy.dev_speculativedeployments.yaml"


def apply(kubectl: Kubectl, namespace: str, doc: dict[str, Any], *extra: str) -> Any:
    return kubectl("apply", "--server-side", "-n", namespace, "-f", "-", *extra, input=json.dumps(doc))


def warned(stderr: str) -> bool:
    """kubectl printed the policy's warning (which the API server prefixes with the policy's name)."""
    text = " ".join(stderr.split())
    return text.startswith("Warning: ") and TENSORRT_BACKEND_WARNING in text


@pytest.fixture
def policy_in_effect(kubectl: Kubectl, namespace: str) -> None:
    """The API server loads a new policy from its informer: a dry run shows when it acts."""
    doc = yaml.safe_load(TENSORRT.read_text())
    wait_for(
        lambda: warned(apply(kubectl, namespace, doc, "--dry-run=server").stderr),
        timeout=60,
        what="the backend warning policy in effect",
    )


@pytest.mark.usefixtures("policy_in_effect")
def test_choosing_tensorrt_is_admitted_with_a_warning_naming_the_removal_and_the_migration(
    kubectl: Kubectl, namespace: str
) -> None:
    doc = yaml.safe_load(TENSORRT.read_text())
    created = apply(kubectl, namespace, doc)
    assert "serverside-applied" in created.stdout
    assert warned(created.stderr), created.stderr
    # Re-applying the same spec says nothing more; a change of a spec that still chooses tensorrt warns again.
    assert not warned(apply(kubectl, namespace, doc).stderr)
    doc["spec"]["replicas"] = 2
    assert warned(apply(kubectl, namespace, doc).stderr)


@pytest.mark.usefixtures("policy_in_effect")
def test_pytorch_and_the_default_draw_no_warning(kubectl: Kubectl, namespace: str) -> None:
    explicit = yaml.safe_load(PYTORCH.read_text())
    result = apply(kubectl, namespace, explicit)
    assert "Warning" not in result.stderr, result.stderr
    default = yaml.safe_load(PYTORCH.read_text())
    default["metadata"]["name"] = "by-default"
    del default["spec"]["backend"]
    result = apply(kubectl, namespace, default)
    assert "Warning" not in result.stderr, result.stderr
    stored = json.loads(kubectl("get", "sdep", "by-default", "-n", namespace, "-o", "json").stdout)
    assert stored["spec"]["backend"] == "pytorch"


@pytest.fixture
def crd_of_an_earlier_release(kubectl: Kubectl) -> Iterator[None]:
    """The SpeculativeDeployment CRD as earlier releases had it (default `tensorrt`), put back after."""
    crd = yaml.safe_load(CRD.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    assert spec["properties"]["backend"]["default"] == "pytorch"
    spec["properties"]["backend"]["default"] = "tensorrt"
    kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(crd))
    try:
        yield
    finally:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))


def test_a_deployment_stored_under_the_old_default_keeps_tensorrt(
    kubectl: Kubectl, namespace: str, crd_of_an_earlier_release: None
) -> None:
    doc = yaml.safe_load(TENSORRT.read_text())
    del doc["spec"]["backend"]
    name = doc["metadata"]["name"]

    def backend() -> str:
        stored = json.loads(kubectl("get", "sdep", name, "-n", namespace, "-o", "json").stdout)
        return str(stored["spec"]["backend"])

    def default_now() -> str:
        probe = {
            "apiVersion": doc["apiVersion"],
            "kind": doc["kind"],
            "metadata": {"name": "probe"},
            "spec": {"target": {"model": {"uri": "hf://org/model"}}, "speculative": {"method": "none"}},
        }
        dry_run = apply(kubectl, namespace, probe, "--dry-run=server", "-o", "json")
        return str(json.loads(dry_run.stdout)["spec"]["backend"])

    # A CRD's new default reaches the API server's handlers a moment after the apply: a dry run shows it.
    wait_for(lambda: default_now() == "tensorrt", timeout=60, what="the earlier CRD's default in effect")
    apply(kubectl, namespace, doc)
    assert backend() == "tensorrt"
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    wait_for(lambda: default_now() == "pytorch", timeout=60, what="this release's default in effect")
    assert backend() == "tensorrt", "the default applies to new objects; a stored backend is never changed"
