"""Condition `EngineCacheReady` on the local cluster's real API server, PV controller and provisioner: a claim
whose StorageClass's provisioner refuses ReadWriteMany (this test plays that provisioner, as a block-storage
CSI driver would answer: a `ProvisioningFailed` event on the claim), and a user's claim bound ReadWriteOnce by
the cluster's default provisioner. Both reach the deployment's status with the provisioner's or the claim's
words, and a Warning event."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.conftest import OPERATOR_NAMESPACE_PREFIX, Kubectl, fresh_namespace, wait_for

REPO = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "specdeploy.dev", "v1alpha1", "speculativedeployments"
PROVISIONER = "block.example.com"
REFUSAL = (
    "rpc error: code = InvalidArgument desc = Volume capabilities MULTI_NODE_MULTI_WRITER not supported. "
    "Only AccessModes[ReadWriteOnce] supported."
)

pytestmark = pytest.mark.usefixtures("operator")


@pytest.fixture
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    with fresh_namespace(core, OPERATOR_NAMESPACE_PREFIX) as name:
        yield name


def _deployment(namespace: str, engine_cache: dict[str, Any]) -> dict[str, Any]:
    path = REPO / "examples" / "02-draft-target-llama8b-1b-h100.yaml"
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    doc["metadata"]["namespace"] = namespace
    doc["spec"]["engineCache"] = engine_cache
    return doc


def _cache_condition(custom: client.CustomObjectsApi, namespace: str, name: str) -> dict[str, Any] | None:
    body = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    conditions = (body.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c["type"] == "EngineCacheReady"), None)


def _warning(core: client.CoreV1Api, namespace: str, name: str, reason: str) -> Any:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
    return next((e for e in events if e.reason == reason and e.type == "Warning"), None)


def test_a_claim_its_provisioner_refuses_is_reported_with_the_provisioners_message(
    kubectl: Kubectl, api_client: client.ApiClient, namespace: str
) -> None:
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    storage = client.StorageV1Api(api_client)
    class_name = f"block-only-{uuid.uuid4().hex[:8]}"
    storage.create_storage_class(
        client.V1StorageClass(
            metadata=client.V1ObjectMeta(name=class_name),
            provisioner=PROVISIONER,
            volume_binding_mode="Immediate",
        )
    )
    try:
        doc = _deployment(namespace, {"size": "1Ti", "storageClassName": class_name})
        kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))
        name = doc["metadata"]["name"]
        claim = f"{name}-engine-cache"

        def pending() -> dict[str, Any] | None:
            cond = _cache_condition(custom, namespace, name)
            return cond if cond and cond["reason"] == "ClaimPending" else None

        # Nobody provisions the class yet: the claim waits, and the condition says what Kubernetes said.
        waiting = wait_for(pending, timeout=60, what="EngineCacheReady ClaimPending")
        assert waiting["status"] == "Unknown"
        # The class's provisioner refuses, as a block-storage CSI driver does for ReadWriteMany.
        now = datetime.now(UTC)
        involved = core.read_namespaced_persistent_volume_claim(claim, namespace)
        core.create_namespaced_event(
            namespace,
            client.CoreV1Event(
                metadata=client.V1ObjectMeta(name=f"{claim}.{uuid.uuid4().hex[:8]}"),
                involved_object=client.V1ObjectReference(
                    kind="PersistentVolumeClaim",
                    namespace=namespace,
                    name=claim,
                    uid=involved.metadata.uid,
                    api_version="v1",
                ),
                reason="ProvisioningFailed",
                message=f'failed to provision volume with StorageClass "{class_name}": {REFUSAL}',
                type="Warning",
                source=client.V1EventSource(component=f"{PROVISIONER}_csi-controller-0"),
                first_timestamp=now,
                last_timestamp=now,
                count=1,
            ),
        )

        def refused() -> dict[str, Any] | None:
            cond = _cache_condition(custom, namespace, name)
            return cond if cond and cond["reason"] == "ClaimProvisioningFailed" else None

        cond = wait_for(refused, timeout=90, interval=1, what="EngineCacheReady ClaimProvisioningFailed")
        assert cond["status"] == "False"
        assert REFUSAL in cond["message"]
        assert class_name in cond["message"]
        assert PROVISIONER in cond["message"]
        event = wait_for(
            lambda: _warning(core, namespace, name, "ClaimProvisioningFailed"), timeout=30, what="the event"
        )
        assert REFUSAL in event.message
    finally:
        try:
            storage.delete_storage_class(class_name)
        except ApiException as error:
            if error.status != 404:
                raise


def test_a_users_claim_bound_read_write_once_is_reported_as_not_shareable(
    kubectl: Kubectl, api_client: client.ApiClient, namespace: str
) -> None:
    core, custom = client.CoreV1Api(api_client), client.CustomObjectsApi(api_client)
    claim = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "single-node-cache", "namespace": namespace},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Ti"}}},
    }
    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(claim))

    def bound() -> bool:
        live = core.read_namespaced_persistent_volume_claim("single-node-cache", namespace)
        return bool(live.status.phase == "Bound")

    wait_for(bound, timeout=60, what="the default provisioner to bind the claim")
    doc = _deployment(namespace, {"pvcName": "single-node-cache"})
    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))
    name = doc["metadata"]["name"]

    def not_shareable() -> dict[str, Any] | None:
        cond = _cache_condition(custom, namespace, name)
        return cond if cond and cond["reason"] == "ClaimNotReadWriteMany" else None

    cond = wait_for(not_shareable, timeout=60, what="EngineCacheReady ClaimNotReadWriteMany")
    assert cond["status"] == "False"
    assert "ReadWriteOnce" in cond["message"]
    assert "single-node-cache" in cond["message"]
    event = wait_for(
        lambda: _warning(core, namespace, name, "ClaimNotReadWriteMany"), timeout=30, what="the event"
    )
    assert "ReadWriteMany StorageClass" in event.message


def test_the_default_claim_on_a_read_write_many_class_is_ready(
    kubectl: Kubectl, api_client: client.ApiClient, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api_client)
    doc = _deployment(namespace, {"size": "1Ti"})
    kubectl("apply", "--server-side", "-f", "-", input=json.dumps(doc))
    name = doc["metadata"]["name"]

    def ready() -> dict[str, Any] | None:
        cond = _cache_condition(custom, namespace, name)
        return cond if cond and cond["status"] == "True" else None

    cond = wait_for(ready, timeout=90, interval=1, what="EngineCacheReady True")
    assert cond["reason"] == "ClaimBound"
    assert "ReadWriteMany" in cond["message"]
