"""Pull secrets and ServiceAccounts on the local cluster's real API server: a deployment that names them gets
build pods and serving pods running as those accounts with those Secrets (the API server's ServiceAccount
admission checks that each account exists), and the engines it builds are the ones built without them."""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.conftest import OPERATOR_NAMESPACE_PREFIX, Kubectl, fresh_namespace, wait_for

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION = "specdeploy.dev", "v1alpha1"

pytestmark = pytest.mark.usefixtures("operator")


@pytest.fixture
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    with fresh_namespace(core, OPERATOR_NAMESPACE_PREFIX) as name:
        yield name


def _example() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(
        (REPO / "examples" / "02-draft-target-llama8b-1b-h100.yaml").read_text()
    )
    return doc


def test_pods_run_as_the_named_accounts_with_the_named_pull_secrets(
    kubectl: Kubectl, api_client: client.ApiClient, namespace: str
) -> None:
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    for account in ("llama-serving", "model-reader"):
        core.create_namespaced_service_account(
            namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=account))
        )
    kubectl(
        "create", "secret", "docker-registry", "team-registry", "-n", namespace,
        "--docker-server=registry.example.com", "--docker-username=robot", "--docker-password=unused",
    )  # fmt: skip
    plain = _example()
    plain["metadata"] = {"name": "plain", "namespace": namespace}
    doc = copy.deepcopy(_example())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["images"] = {"pullSecrets": ["team-registry"]}
    doc["spec"]["serviceAccounts"] = {"serving": "llama-serving", "build": "model-reader"}
    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))
    name = doc["metadata"]["name"]

    def ready() -> bool:
        body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, "speculativedeployments", name)
        return (body.get("status") or {}).get("phase") == "Ready"

    wait_for(ready, timeout=180, interval=1, what=f"{name} Ready")
    pods = core.list_namespaced_pod(namespace).items
    builds = [p for p in pods if "job-name" in (p.metadata.labels or {})]
    serving = [p for p in pods if (p.metadata.labels or {}).get("app.kubernetes.io/instance") == name]
    assert builds
    assert serving
    for pod in builds + serving:
        expected = "model-reader" if pod in builds else "llama-serving"
        assert pod.spec.service_account_name == expected, pod.metadata.name
        assert [s.name for s in pod.spec.image_pull_secrets or []] == ["team-registry"], pod.metadata.name
        # hf:// downloads read a token file, not the account: no API token in these pods.
        assert pod.spec.automount_service_account_token is False, pod.metadata.name
    # A deployment without them needs the very same engines: nothing is built again.
    before = {e["metadata"]["name"] for e in custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "enginebuilds")["items"]}  # fmt: skip
    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(plain))

    def plain_ready() -> dict[str, Any] | None:
        body = custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, "speculativedeployments", "plain"
        )
        status = body.get("status") or {}
        return status if status.get("phase") == "Ready" else None

    status = wait_for(plain_ready, timeout=180, interval=1, what="plain Ready")
    assert {status["engines"][role]["name"] for role in ("target", "draft")} == before
    after = {e["metadata"]["name"] for e in custom.list_namespaced_custom_object(
        GROUP, VERSION, namespace, "enginebuilds")["items"]}  # fmt: skip
    assert after == before
