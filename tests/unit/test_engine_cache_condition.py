"""Condition `EngineCacheReady`: the engine-cache claim's truth (bound ReadWriteMany, refused by its
provisioner with the provisioner's message, bound or asked ReadWriteOnce, missing), and its Warning event,
from the claim and the events about it; then through the reconciler on the fake cluster."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

from specdeploy_operator.api import ConditionStatus, Reason
from specdeploy_operator.controller.cachestatus import CACHE_RETRY_SECONDS, cache_condition
from specdeploy_operator.controller.deployments import reconcile_deployment

from tests.unit.fake_cluster import FakeKube, bound_reconciler

NS = "team"
REFUSAL = (
    'failed to provision volume with StorageClass "gp3": rpc error: code = InvalidArgument desc = Volume '
    "capabilities MULTI_NODE_MULTI_WRITER not supported. Only AccessModes[ReadWriteOnce] supported."
)


def claim(phase: str | None, modes: list[str], storage_class: str | None = "gp3") -> dict[str, Any]:
    spec: dict[str, Any] = {"accessModes": modes, "resources": {"requests": {"storage": "1Ti"}}}
    if storage_class:
        spec["storageClassName"] = storage_class
    status: dict[str, Any] = {"phase": phase} if phase else {}
    if phase == "Bound":
        status["accessModes"] = modes
    return {"metadata": {"name": "cache", "namespace": NS}, "spec": spec, "status": status}


def event(reason: str, message: str, when: str, type_: str = "Warning") -> dict[str, Any]:
    return {
        "type": type_,
        "reason": reason,
        "message": message,
        "lastTimestamp": when,
        "source": {"component": "ebs.csi.aws.com_ebs-csi-controller-0"},
    }


def test_a_bound_read_write_many_claim_is_ready() -> None:
    cond = cache_condition("cache", claim("Bound", ["ReadWriteMany"], "efs-rwx"), [], user_claim=False)
    assert (cond.status, cond.reason) == (ConditionStatus.TRUE, Reason.CLAIM_BOUND)
    assert "efs-rwx" in cond.message


def test_a_provisioner_refusal_is_false_with_the_provisioners_newest_message() -> None:
    events = [
        event("ExternalProvisioning", "waiting for a volume to be created", "2026-11-21T11:00:00Z", "Normal"),
        event("ProvisioningFailed", "an older failure", "2026-11-21T11:00:01Z"),
        event("ProvisioningFailed", REFUSAL, "2026-11-21T11:00:05Z"),
    ]
    cond = cache_condition("cache", claim("Pending", ["ReadWriteMany"]), events, user_claim=False)
    assert (cond.status, cond.reason) == (ConditionStatus.FALSE, Reason.CLAIM_PROVISIONING_FAILED)
    assert REFUSAL in cond.message
    assert "ebs.csi.aws.com" in cond.message
    assert "an older failure" not in cond.message
    assert "ReadWriteMany StorageClass" in cond.message


def test_a_claim_bound_read_write_once_cannot_serve_a_second_node() -> None:
    cond = cache_condition("cache", claim("Bound", ["ReadWriteOnce"], None), [], user_claim=True)
    assert (cond.status, cond.reason) == (ConditionStatus.FALSE, Reason.CLAIM_NOT_READ_WRITE_MANY)
    assert "ReadWriteOnce" in cond.message
    assert "the cluster's default" in cond.message


def test_a_pending_claim_that_asks_read_write_once_is_refused_before_it_binds() -> None:
    cond = cache_condition("cache", claim("Pending", ["ReadWriteOnce"]), [], user_claim=True)
    assert cond.reason == Reason.CLAIM_NOT_READ_WRITE_MANY


def test_a_claim_waiting_without_a_failure_is_unknown_with_what_kubernetes_said() -> None:
    waiting = event(
        "ExternalProvisioning",
        "Waiting for a volume to be created either by the external provisioner 'efs.csi.aws.com' ...",
        "2026-11-21T11:00:00Z",
        "Normal",
    )
    cond = cache_condition("cache", claim("Pending", ["ReadWriteMany"]), [waiting], user_claim=False)
    assert (cond.status, cond.reason) == (ConditionStatus.UNKNOWN, Reason.CLAIM_PENDING)
    assert "efs.csi.aws.com" in cond.message


def test_a_missing_claim_is_false_only_when_the_user_named_it() -> None:
    named = cache_condition("cache", None, [], user_claim=True)
    assert (named.status, named.reason) == (ConditionStatus.FALSE, Reason.CLAIM_MISSING)
    assert "spec.engineCache.pvcName" in named.message
    ours = cache_condition("cache", None, [], user_claim=False)
    assert (ours.status, ours.reason) == (ConditionStatus.UNKNOWN, Reason.CLAIM_PENDING)


def test_a_lost_claim_is_false() -> None:
    cond = cache_condition("cache", claim("Lost", ["ReadWriteMany"]), [], user_claim=False)
    assert cond.reason == Reason.CLAIM_LOST


# -- through the reconciler ----------------------------------------------------------------------------------


class _Kube(FakeKube):
    """The fake cluster with events about claims (a provisioner's)."""

    def __init__(self) -> None:
        super().__init__()
        self.claim_events: list[dict[str, Any]] = []

    async def events_about(self, namespace: str, kind: str, name: str) -> list[dict[str, Any]]:
        self.requests.append(("list", "Event", name))
        return copy.deepcopy(self.claim_events) if kind == "PersistentVolumeClaim" else []


def gpu_deployment(cache: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "backend": "tensorrt",
        "target": {"model": {"uri": "hf://org/target-8b"}},
        "speculative": {"method": "promptLookup"},
    }
    if cache:
        spec["engineCache"] = cache
    return {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": "gpu", "namespace": NS, "uid": "uid-gpu", "generation": 1},
        "spec": spec,
    }


def _reconcile(kube: _Kube, doc: dict[str, Any]) -> tuple[dict[str, Any], float | None]:
    kube.store[("SpeculativeDeployment", NS, "gpu")] = copy.deepcopy(doc)
    reconciler = bound_reconciler(kube)
    retry = asyncio.run(reconcile_deployment(reconciler, NS, "gpu"))
    status = kube.store[("SpeculativeDeployment", NS, "gpu")].get("status") or {}
    [cond] = [c for c in status.get("conditions") or () if c["type"] == "EngineCacheReady"]
    return cond, retry


def test_the_reconciler_reports_a_refused_claim_with_a_warning_event_and_looks_again() -> None:
    kube = _Kube()
    kube.claim_events = [event("ProvisioningFailed", REFUSAL, "2026-11-21T11:00:05Z")]
    doc = gpu_deployment({"size": "1Ti", "storageClassName": "gp3"})
    cond, retry = _reconcile(kube, doc)
    assert (cond["status"], cond["reason"]) == ("False", "ClaimProvisioningFailed")
    assert REFUSAL in cond["message"]
    assert ("Warning", "ClaimProvisioningFailed", cond["message"]) in kube.events
    assert retry is not None
    assert retry <= CACHE_RETRY_SECONDS
    # Once bound ReadWriteMany, the condition clears and no event list is asked for any more.
    key = ("PersistentVolumeClaim", NS, "gpu-engine-cache")
    kube.store[key]["status"] = {"phase": "Bound", "accessModes": ["ReadWriteMany"]}
    kube.requests.clear()
    kube.events.clear()
    cond, _ = _reconcile(kube, kube.store[("SpeculativeDeployment", NS, "gpu")])
    assert (cond["status"], cond["reason"]) == ("True", "ClaimBound")
    assert ("list", "Event", "gpu-engine-cache") not in kube.requests
    assert not [e for e in kube.events if e[1].startswith("Claim")]


def test_the_reconciler_reports_a_users_read_write_once_claim() -> None:
    kube = _Kube()
    kube.store[("PersistentVolumeClaim", NS, "mine")] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        **claim("Bound", ["ReadWriteOnce"], "standard"),
        "metadata": {"name": "mine", "namespace": NS},
    }
    cond, _ = _reconcile(kube, gpu_deployment({"pvcName": "mine"}))
    assert (cond["status"], cond["reason"]) == ("False", "ClaimNotReadWriteMany")
    assert ("Warning", "ClaimNotReadWriteMany", cond["message"]) in kube.events


def test_a_deployment_without_engines_has_no_cache_condition() -> None:
    kube = _Kube()
    doc = gpu_deployment()
    doc["spec"] = {
        "backend": "transformers",
        "target": {"model": {"uri": "pvc://models/target"}},
        "speculative": {"method": "promptLookup"},
        "placement": {"device": "cpu"},
    }
    kube.store[("SpeculativeDeployment", NS, "gpu")] = copy.deepcopy(doc)
    asyncio.run(reconcile_deployment(bound_reconciler(kube), NS, "gpu"))
    status = kube.store[("SpeculativeDeployment", NS, "gpu")].get("status") or {}
    assert "EngineCacheReady" not in [c["type"] for c in status.get("conditions") or ()]
