"""The operator acts on live state, against the real control plane: hand edits of owned fields reverted on
their watch event, terminal build phases kept, refused writes reported, MIG deployments built and served.

The session's operator resyncs every 60 s (tests/conftest.py), so a repair seen within 15 s came from the
watch event of the edit, not from the resync.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client

from tests.conftest import OPERATOR_NAMESPACE_PREFIX, Kubectl, fresh_namespace, wait_for, wait_quiet
from tests.integration.test_operator import FAILING_IMAGE, Cluster, condition, example

pytestmark = pytest.mark.usefixtures("operator")

REPAIR_SECONDS = 15.0
"""Well under the operator's 60 s resync."""
MIG = "nvidia.com/mig-3g.40gb"


@pytest.fixture
def cluster(kubectl: Kubectl, api_client: client.ApiClient) -> Iterator[Cluster]:
    with fresh_namespace(client.CoreV1Api(api_client), OPERATOR_NAMESPACE_PREFIX) as namespace:
        yield Cluster(kubectl, api_client, namespace)


def sdep_version(cluster: Cluster, name: str) -> str:
    return str(cluster.sdep(name)["metadata"]["resourceVersion"])


def edit(cluster: Cluster, kind: str, name: str, patch: dict[str, Any]) -> None:
    """A person's `kubectl patch` (merge patch, its own field manager)."""
    cluster.kubectl("patch", kind, name, "-n", cluster.namespace, "--type=merge", "-p", json.dumps(patch))


def repaired(what: str, check: Callable[[], bool]) -> None:
    wait_for(lambda: check() or None, timeout=REPAIR_SECONDS, interval=0.1, what=f"{what} reverted")


def test_hand_edits_of_owned_fields_are_reverted_on_their_watch_event_without_a_status_write(
    cluster: Cluster,
) -> None:
    name = cluster.apply(example("02"))
    cluster.wait_phase(name, "Ready", timeout=120)
    # the rollout's last status write: over once the resourceVersion stops moving
    before = wait_quiet(lambda: sdep_version(cluster, name), what="the resource's version after Ready")
    ns = cluster.namespace
    config_name = f"{name}-server-config"
    config = cluster.core.read_namespaced_config_map(config_name, ns).data["server.yaml"]
    port = cluster.core.read_namespaced_service(name, ns).spec.ports[0].port
    min_available = cluster.kubectl(
        "get", "pdb", name, "-n", ns, "-o", "jsonpath={.spec.minAvailable}"
    ).stdout

    edit(cluster, "configmap", config_name, {"data": {"server.yaml": "{}"}})
    repaired(
        "the ConfigMap's data",
        lambda: cluster.core.read_namespaced_config_map(config_name, ns).data["server.yaml"] == config,
    )
    edit(
        cluster, "service", name, {"spec": {"ports": [{"name": "http", "port": 9999, "targetPort": "http"}]}}
    )
    repaired(
        "the Service's port",
        lambda: cluster.core.read_namespaced_service(name, ns).spec.ports[0].port == port,
    )
    edit(cluster, "pdb", name, {"spec": {"minAvailable": 5}})
    repaired(
        "the PDB",
        lambda: (
            cluster.kubectl("get", "pdb", name, "-n", ns, "-o", "jsonpath={.spec.minAvailable}").stdout
            == min_available
        ),
    )
    after = wait_quiet(lambda: sdep_version(cluster, name), what="the resource's version after the repairs")
    assert after == before, "no status write: nothing a user relies on changed"
    assert cluster.status(name)["phase"] == "Ready"


def test_a_scaled_deployment_goes_back_to_the_replicas_of_its_speculative_deployment(
    cluster: Cluster,
) -> None:
    name = cluster.apply(example("02"))
    cluster.wait_phase(name, "Ready", timeout=120)
    edit(cluster, "deployment", name, {"spec": {"replicas": 3}})
    repaired(
        "the Deployment's replicas",
        lambda: cluster.apps.read_namespaced_deployment(name, cluster.namespace).spec.replicas == 1,
    )
    # Ready throughout (the rendered pod never stopped serving); the counts follow the surplus pods away.
    wait_for(
        lambda: (
            s
            if (s := cluster.status(name)).get("replicas") == s.get("readyReplicas") == 1
            and s.get("phase") == "Ready"
            else None
        ),
        timeout=60,
        interval=0.5,
        what="status back to 1 of 1 replicas, Ready",
    )


def test_a_failed_build_whose_job_is_deleted_stays_failed_until_a_retry_is_asked_for(
    cluster: Cluster,
) -> None:
    doc = example("02")
    doc["spec"]["images"] = {"builder": FAILING_IMAGE}
    name = cluster.apply(doc)
    cluster.wait_phase(name, "Failed", timeout=120)
    # The deployment fails with its first failed build; the other build's Job may still be retrying, and a
    # running build whose Job is deleted gets a new one. Every build must have failed before the deletion.
    failed = wait_for(
        lambda: (
            builds
            if (builds := cluster.engine_builds())
            and all((e.get("status") or {}).get("phase") == "Failed" for e in builds)
            else None
        ),
        timeout=120,
        what="every EngineBuild Failed",
    )
    engine = failed[0]["metadata"]["name"]
    first_job = failed[0]["status"]["jobName"]
    cluster.kubectl("delete", "jobs", "--all", "-n", cluster.namespace, "--wait=true")
    # The Job's and then its pods' deletions are watch events of the EngineBuild: once the pods are gone too
    # and nothing has moved for a few seconds, every one of them has been reconciled.
    wait_for(
        lambda: not cluster.core.list_namespaced_pod(cluster.namespace).items,
        timeout=60,
        what="the build pods gone",
        describe=lambda: [
            (p.metadata.name, p.status.phase, p.metadata.finalizers, p.metadata.deletion_timestamp)
            for p in cluster.core.list_namespaced_pod(cluster.namespace).items
        ],
    )
    wait_quiet(
        lambda: ([j.metadata.uid for j in cluster.jobs()], [e["status"] for e in cluster.engine_builds()]),
        what="the Jobs and the EngineBuilds after the deletion",
    )
    assert cluster.jobs() == [], "no build Job was created again"
    builds = {e["metadata"]["name"]: e["status"]["phase"] for e in cluster.engine_builds()}
    assert builds[engine] == "Failed"
    assert cluster.status(name)["phase"] == "Failed"

    cluster.kubectl("annotate", "enginebuild", engine, "-n", cluster.namespace, "specdeploy.dev/retry=1")

    def retried() -> dict[str, Any] | None:
        body = next(e for e in cluster.engine_builds() if e["metadata"]["name"] == engine)
        status = body.get("status") or {}
        return (
            status
            if status.get("jobName") not in (None, first_job) and status.get("phase") == "Failed"
            else None
        )

    status = wait_for(retried, timeout=120, what="a second attempt, failed as well (same image)")
    assert {j.metadata.name for j in cluster.jobs()} <= {status["jobName"]}


def test_an_apply_the_api_server_refuses_is_reported_and_retried_until_it_succeeds(cluster: Cluster) -> None:
    ns = cluster.namespace
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-services", "namespace": ns},
        "spec": {"hard": {"services": "0"}},
    }
    cluster.kubectl("apply", "-f", "-", input=json.dumps(quota))
    wait_for(
        lambda: cluster.core.read_namespaced_resource_quota("no-services", ns).status.hard or None,
        timeout=30,
        what="the quota's status (admission enforces it only then)",
    )
    name = cluster.apply(example("02"))

    def refused() -> dict[str, Any] | None:
        status = cluster.status(name)
        synced = next((c for c in status.get("conditions") or () if c["type"] == "Synced"), None)
        return synced if synced is not None and synced["status"] == "False" else None

    synced = wait_for(refused, timeout=120, what="Synced False")
    assert synced["reason"] == "ReconcileError"
    assert "exceeded quota: no-services" in synced["message"]
    assert "Service" in synced["message"] or "services" in synced["message"]

    def reasons() -> set[str]:
        selector = f"involvedObject.name={name}"
        return {e.reason for e in cluster.core.list_namespaced_event(ns, field_selector=selector).items}

    # The operator posts its events after the status write the test has just read.
    wait_for(
        lambda: "ReconcileError" in reasons(),
        timeout=30,
        what="the ReconcileError event",
    )

    cluster.kubectl("delete", "resourcequota", "no-services", "-n", ns)
    status = cluster.wait_phase(name, "Ready", timeout=180)
    assert condition(status, "Synced")["status"] == "True"


def test_a_mig_deployment_builds_and_serves_on_mig_slices(cluster: Cluster) -> None:
    doc = example("02")
    doc["spec"]["placement"]["gpuResource"] = MIG
    name = cluster.apply(doc)
    status = cluster.wait_phase(name, "Ready", timeout=180)
    nodes = {n.metadata.name: n for n in cluster.core.list_node().items}
    build_pods = cluster.pods("specdeploy.dev/engine-role")
    assert build_pods
    serving = cluster.pods(status["selector"])
    assert serving
    for pod in [*build_pods, *serving]:
        node = nodes[pod.spec.node_name]
        assert MIG in (node.status.capacity or {}), f"{pod.metadata.name} ran on {node.metadata.name}"
        requests = [
            c.resources.requests or {} for c in [*(pod.spec.init_containers or []), *pod.spec.containers]
        ]
        assert any(MIG in r for r in requests)
        assert not any("nvidia.com/gpu" in r for r in requests)
