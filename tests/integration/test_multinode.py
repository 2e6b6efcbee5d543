"""Replicas that span nodes on the real control plane with the real LeaderWorkerSet controller (its webhooks
on loopback); kwok plays the GPU nodes, so the pods of a group are scheduled, grouped, restarted and counted,
and no rank runs. Every test applies SpeculativeDeployments with kubectl, as a user would."""

from __future__ import annotations

import copy
import json
import time
from typing import Any

import pytest
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.nodepools import MULTINODE_LABEL, MULTINODE_TOLERATION

from tests.conftest import wait_for
from tests.integration.test_operator import Cluster, cluster, condition, example

__all__ = ["cluster"]

pytestmark = pytest.mark.usefixtures("operator", "lws_cluster")

MULTINODE_AUTOSCALED = "h100-multinode-autoscaled"

LWS = ("leaderworkerset.x-k8s.io", "v1", "leaderworkersets")


def deepseek(**placement: Any) -> dict[str, Any]:
    """Example 11 on the local cluster's multinode pools (their label and taint keep other tests off them)."""
    doc = copy.deepcopy(example("11"))
    where = doc["spec"]["placement"]
    where["nodeSelector"] = {MULTINODE_LABEL: "true"}
    where["tolerations"] = [*where["tolerations"], MULTINODE_TOLERATION]
    where.update(placement)
    return doc


def group_set(cluster: Cluster, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
        *LWS[:2], cluster.namespace, LWS[2], f"{name}-lws"
    )
    return obj


def group_pods(cluster: Cluster, name: str) -> list[Any]:
    return cluster.pods(f"app.kubernetes.io/instance={name}")


def test_a_two_node_group_becomes_ready_with_the_leader_alone_behind_the_service(cluster: Cluster) -> None:
    name = cluster.apply(deepseek())
    status = cluster.wait_phase(name, "Ready", timeout=180)
    assert status["nodesPerReplica"] == 2
    assert status["gpusPerReplica"] == 16
    assert (status["readyReplicas"], status["readyText"]) == (1, "1/1")
    lws = group_set(cluster, name)
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 2
    assert lws["status"]["readyReplicas"] == 1
    pods = group_pods(cluster, name)
    assert len(pods) == 2
    assert len({p.spec.node_name for p in pods}) == 2, "one pod per node"
    for pod in pods:
        assert pod.spec.containers[0].resources.requests["nvidia.com/gpu"] == "8"
        env = {e.name: e.value for e in pod.spec.containers[0].env or ()}
        # The LeaderWorkerSet pod webhook's environment, which the launch scripts read.
        assert env["LWS_GROUP_SIZE"] == "2"
        assert env["LWS_LEADER_ADDRESS"].startswith(f"{name}-lws-0.{name}-lws.{cluster.namespace}")
    (leader,) = [p for p in pods if p.metadata.labels["app.kubernetes.io/component"] == "server"]
    assert leader.metadata.name == f"{name}-lws-0"

    # The Service routes to the leader only: its EndpointSlices hold the leader's address and nothing else.
    # They are the EndpointSlice controller's, written after the pods are ready: waited for, then compared.
    def addresses() -> list[str]:
        return cluster.kubectl(
            "get", "endpointslices", "-n", cluster.namespace, "-l", f"kubernetes.io/service-name={name}",
            "-o", "jsonpath={.items[*].endpoints[*].addresses[*]}",
        ).stdout.split()  # fmt: skip

    discovery = wait_for(addresses, timeout=60, interval=0.5, what=f"the endpoints of Service {name}")
    assert discovery == [leader.status.pod_ip]
    assert not cluster.apps.list_namespaced_deployment(cluster.namespace).items


def test_a_deleted_worker_recreates_its_whole_group(cluster: Cluster) -> None:
    name = cluster.apply(deepseek())
    cluster.wait_phase(name, "Ready", timeout=180)
    before = {p.metadata.name: p.metadata.uid for p in group_pods(cluster, name)}
    cluster.core.delete_namespaced_pod(f"{name}-lws-0-1", cluster.namespace)

    def unready() -> dict[str, Any] | None:
        status = cluster.status(name)
        return status if status.get("readyReplicas") == 0 else None

    wait_for(unready, timeout=60, interval=0.1, what="the group reported down")
    status = cluster.wait_phase(name, "Ready", timeout=180, since_generation=False)
    assert status["readyText"] == "1/1"
    after = {p.metadata.name: p.metadata.uid for p in group_pods(cluster, name)}
    assert set(after) == set(before)
    assert not set(after.values()) & set(before.values()), "the leader was recreated with its worker"


def test_a_group_that_cannot_be_placed_is_capacity_pending_and_named(cluster: Cluster) -> None:
    # Both pods of the group may only use one node: the worker waits for GPUs no node it may use has.
    only = {MULTINODE_LABEL: "true", "kubernetes.io/hostname": "h100-multinode-0"}
    name = cluster.apply(deepseek(nodeSelector=only))

    def pending() -> dict[str, Any] | None:
        status = cluster.status(name)
        degraded = next((x for x in status.get("conditions") or () if x["type"] == "Degraded"), None)
        return status if degraded is not None and degraded["reason"] == "CapacityPending" else None

    status = wait_for(pending, timeout=120, what="the group CapacityPending")
    assert status["capacityPendingReplicas"] == 1
    message = condition(status, "Degraded")["message"]
    assert "1 of 1 replicas (group 0) wait for capacity" in message
    assert "16 nvidia.com/gpu each, on 2 nodes of 8" in message
    assert "Insufficient nvidia.com/gpu" in message


def placement(cluster: Cluster, name: str) -> str:
    """Each pod of the deployment's groups: name, node, readiness, and whether it is being deleted."""
    return ", ".join(
        f"{p.metadata.name}@{p.spec.node_name or '-'}"
        f"{'+' if any(c.type == 'Ready' and c.status == 'True' for c in p.status.conditions or ()) else '?'}"
        f"{' deleting' if p.metadata.deletion_timestamp else ''}"
        for p in sorted(group_pods(cluster, name), key=lambda p: p.metadata.name)
    )


def multinode_pods(cluster: Cluster) -> list[str]:
    """Every pod, in any namespace, bound to a node of the multinode pools."""
    nodes = {n.metadata.name for n in cluster.core.list_node(label_selector=f"{MULTINODE_LABEL}=true").items}
    return [
        f"{p.metadata.namespace}/{p.metadata.name}"
        for p in cluster.core.list_pod_for_all_namespaces().items
        if p.spec.node_name in nodes
    ]


def autoscaled(local_cluster: LocalCluster) -> list[str]:
    return sorted(n["metadata"]["name"] for n in local_cluster.autoscaled_nodes(MULTINODE_AUTOSCALED))


def test_scaling_adds_a_group_on_two_new_nodes_and_a_rollout_keeps_max_unavailable(
    cluster: Cluster, autoscaling_cluster: LocalCluster
) -> None:
    wait_for(lambda: not autoscaled(autoscaling_cluster), timeout=120, what="no autoscaled multinode nodes")
    # The namespaces of earlier tests go asynchronously: their groups must have left the two static nodes, or
    # the first group would take an autoscaled node and the counts below would not be this test's.
    wait_for(lambda: not multinode_pods(cluster), timeout=120, what="no group of another test on the nodes")
    name = cluster.apply(deepseek())
    try:
        cluster.wait_phase(name, "Ready", timeout=180)
        # The SpeculativeDeployment's scale subresource, as an HPA or KEDA uses it.
        cluster.kubectl("scale", f"sdep/{name}", "-n", cluster.namespace, "--replicas=2")
        status = cluster.wait_phase(name, "Ready", timeout=240)
        assert (status["replicas"], status["readyReplicas"], status["readyText"]) == (2, 2, "2/2")
        assert len(autoscaled(autoscaling_cluster)) == 2, "the second group got two new nodes"
        assert group_set(cluster, name)["spec"]["replicas"] == 2

        # A new draft length rolls the groups one at a time (maxUnavailable 1, maxSurge 0).
        cluster.patch(name, {"speculative": {"maxDraftLen": 2}})
        lowest = 2
        timeline: list[str] = []
        generation = cluster.sdep(name)["metadata"]["generation"]
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            status = cluster.status(name)
            ready = int(group_set(cluster, name)["status"].get("readyReplicas") or 0)
            lowest = min(lowest, ready)
            seen = f"ready groups {ready}: {placement(cluster, name)}"
            if not timeline or not timeline[-1].endswith(seen):
                timeline.append(f"{time.monotonic() - deadline + 240:6.1f}s {seen}")
            if status.get("phase") == "Ready" and status.get("observedGeneration") == generation:
                break
            time.sleep(0.2)
        assert status.get("phase") == "Ready", status
        assert lowest == 1, "one group served while the other was replaced:\n" + "\n".join(timeline)
        leaders = [
            p
            for p in group_pods(cluster, name)
            if p.metadata.labels["app.kubernetes.io/component"] == "server"
        ]
        hashes = {p.metadata.annotations["specdeploy.dev/config-hash"] for p in leaders}
        assert len(leaders) == 2
        assert len(hashes) == 1, "both groups run the new configuration"

        cluster.kubectl("scale", f"sdep/{name}", "-n", cluster.namespace, "--replicas=1")
        cluster.wait_phase(name, "Ready", timeout=120, since_generation=False)
        wait_for(lambda: not autoscaled(autoscaling_cluster), timeout=180, what="the two nodes removed")
    finally:
        cluster.kubectl("delete", f"sdep/{name}", "-n", cluster.namespace, "--wait=false")
        wait_for(lambda: not autoscaled(autoscaling_cluster), timeout=180, what="the autoscaled nodes gone")


def test_one_node_to_two_and_back_replaces_the_workload_once_the_new_one_serves(
    cluster: Cluster, autoscaling_cluster: LocalCluster
) -> None:
    wait_for(lambda: not autoscaled(autoscaling_cluster), timeout=120, what="no autoscaled multinode nodes")
    doc = deepseek()
    doc["spec"]["target"]["tensorParallel"] = 8
    name = cluster.apply(doc)
    try:
        status = cluster.wait_phase(name, "Ready", timeout=180)
        assert "nodesPerReplica" not in status
        assert cluster.apps.read_namespaced_deployment(name, cluster.namespace).spec.replicas == 1

        cluster.patch(name, {"target": {"tensorParallel": 16}})
        status = cluster.wait_phase(name, "Ready", timeout=240)
        assert status["nodesPerReplica"] == 2
        assert group_set(cluster, name)["status"]["readyReplicas"] == 1
        wait_for(
            lambda: not cluster.apps.list_namespaced_deployment(cluster.namespace).items,
            timeout=60,
            what="the Deployment deleted",
        )

        cluster.patch(name, {"target": {"tensorParallel": 8}})
        status = cluster.wait_phase(name, "Ready", timeout=240)
        assert "nodesPerReplica" not in status
        wait_for(
            lambda: (
                not cluster.custom.list_namespaced_custom_object(*LWS[:2], cluster.namespace, LWS[2])["items"]
            ),
            timeout=60,
            what="the LeaderWorkerSet deleted",
        )

        def replaced() -> list[str]:
            events = cluster.core.list_namespaced_event(cluster.namespace).items
            return [e.message for e in events if e.reason == "WorkloadReplaced"]

        # Events are posted after the writes they tell of.
        wait_for(
            lambda: (
                any(f"deleted Deployment {name}" in m for m in replaced())
                and any(f"deleted LeaderWorkerSet {name}-lws" in m for m in replaced())
            ),
            timeout=30,
            what="a WorkloadReplaced event for each workload replaced",
        )
    finally:
        cluster.kubectl("delete", f"sdep/{name}", "-n", cluster.namespace, "--wait=false")
        wait_for(lambda: not autoscaled(autoscaling_cluster), timeout=180, what="the autoscaled nodes gone")


def test_exclusive_topology_keeps_a_group_on_one_value_of_the_label(cluster: Cluster) -> None:
    # The node-pool label as the topology: a group's pods share a pool (LeaderWorkerSet's pod webhook adds
    # the affinity that says so, and keeps other groups out of it).
    name = cluster.apply(deepseek(multiNode={"exclusiveTopology": "specdeploy.dev/node-pool"}))
    cluster.wait_phase(name, "Ready", timeout=180)
    annotations = group_set(cluster, name)["metadata"]["annotations"]
    assert annotations["leaderworkerset.sigs.k8s.io/exclusive-topology"] == "specdeploy.dev/node-pool"
    pods = group_pods(cluster, name)
    assert len(pods) == 2
    pools = {
        cluster.core.read_node(p.spec.node_name).metadata.labels["specdeploy.dev/node-pool"] for p in pods
    }
    assert len(pools) == 1
    leader = next(p for p in pods if p.metadata.labels["app.kubernetes.io/component"] == "server")
    required = leader.spec.affinity.pod_affinity.required_during_scheduling_ignored_during_execution
    assert [term.topology_key for term in required] == ["specdeploy.dev/node-pool"]


def test_a_group_pod_the_quota_refuses_shows_as_quota_exceeded_and_clears_when_raised(
    cluster: Cluster,
) -> None:
    def quota(gpus: int) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": cluster.namespace},
            "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}},
        }

    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(quota(8)))
    name = cluster.apply(deepseek())  # the leader's 8 GPUs fit the quota, the worker's do not

    def refused() -> dict[str, Any] | None:
        conditions: list[dict[str, Any]] = cluster.status(name).get("conditions") or []
        degraded = next((x for x in conditions if x["type"] == "Degraded"), {})
        return degraded if degraded.get("reason") == "QuotaExceeded" else None

    degraded = wait_for(refused, timeout=90, interval=0.25, what="Degraded QuotaExceeded")
    assert "exceeded quota: gpus" in degraded["message"]
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(quota(16)))
    status = cluster.wait_phase(name, "Ready", timeout=180)
    assert condition(status, "Degraded")["status"] == "False"


def test_a_hand_edit_of_the_leaderworkerset_is_reverted_on_its_event(cluster: Cluster) -> None:
    name = cluster.apply(deepseek())
    cluster.wait_phase(name, "Ready", timeout=180)
    patch = {
        "spec": {"replicas": 2, "rolloutStrategy": {"rollingUpdateConfiguration": {"maxUnavailable": 2}}}
    }
    cluster.custom.patch_namespaced_custom_object(*LWS[:2], cluster.namespace, LWS[2], f"{name}-lws", patch)

    def reverted() -> dict[str, Any] | None:
        spec: dict[str, Any] = group_set(cluster, name)["spec"]
        rolling = spec["rolloutStrategy"]["rollingUpdateConfiguration"]
        return spec if spec["replicas"] == 1 and rolling["maxUnavailable"] == 1 else None

    wait_for(reverted, timeout=30, interval=0.1, what="the LeaderWorkerSet reverted")
    status = cluster.wait_phase(name, "Ready", timeout=120, since_generation=False)
    assert status["readyText"] == "1/1"
