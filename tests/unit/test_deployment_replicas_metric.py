"""`specdeploy_operator_deployment_replicas`: each SpeculativeDeployment's desired and ready replicas as of
its last reconcile (what the alert on a deployment with no ready pod reads), gone with the deployment."""

from __future__ import annotations

import asyncio
import copy

from prometheus_client import REGISTRY
from specdeploy_operator.controller.deployments import reconcile_deployment

from tests.unit.fake_cluster import FakeKube, bound_reconciler
from tests.unit.test_reconciler import NS, cpu_deployment


def _figure(name: str, state: str) -> float | None:
    return REGISTRY.get_sample_value(
        "specdeploy_operator_deployment_replicas", {"namespace": NS, "deployment": name, "state": state}
    )


def test_a_deployment_whose_pods_never_become_ready_reads_desired_but_none_ready() -> None:
    kube = FakeKube()
    doc = cpu_deployment("waiting", 2)
    kube.store[("SpeculativeDeployment", NS, "waiting")] = copy.deepcopy(doc)
    reconciler = bound_reconciler(kube)
    asyncio.run(reconcile_deployment(reconciler, NS, "waiting"))
    assert (_figure("waiting", "desired"), _figure("waiting", "ready")) == (2.0, 0.0)

    # Its Deployment reports ready pods: the next reconcile says so.
    deployment = kube.store[("Deployment", NS, "waiting")]
    deployment["status"] = {"replicas": 2, "readyReplicas": 2, "updatedReplicas": 2, "availableReplicas": 2}
    deployment["status"]["observedGeneration"] = deployment["metadata"].get("generation", 1)
    asyncio.run(reconcile_deployment(reconciler, NS, "waiting"))
    assert _figure("waiting", "ready") == 2.0

    # Deleted: both series go.
    reconciler.deployment_deleted(NS, "waiting", kube.store[("SpeculativeDeployment", NS, "waiting")])
    assert (_figure("waiting", "desired"), _figure("waiting", "ready")) == (None, None)


def test_a_deployment_scaled_to_zero_asks_for_none() -> None:
    kube = FakeKube()
    kube.store[("SpeculativeDeployment", NS, "parked")] = cpu_deployment("parked", 0)
    asyncio.run(reconcile_deployment(bound_reconciler(kube), NS, "parked"))
    assert (_figure("parked", "desired"), _figure("parked", "ready")) == (0.0, 0.0)
