"""The local cluster runs the real LeaderWorkerSet controller (sigs.k8s.io/lws), whose webhooks the apiserver
reaches on 127.0.0.1: a group of two 8-GPU pods lands on two nodes of the multinode pool with the LWS
environment, is recreated whole when one pod goes, and a second group gets two new nodes from the Cluster
Autoscaler, which removes them when the group goes. kwok plays the pods' containers.

These tests need the harness's own cluster with the LWS controller (and, for scaling, its Cluster
Autoscaler): with USE_EXISTING_CLUSTER=1, SPECDEPLOY_LWS=0 or SPECDEPLOY_AUTOSCALING=0 they are skipped,
saying why. Each leaves the shared session cluster as it found it: its namespace deleted and the nodes the
autoscaler made gone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.nodepools import GPU_TAINT, MULTINODE_LABEL, MULTINODE_TOLERATION

from tests.conftest import Kubectl, fresh_namespace, wait_for

GROUP, VERSION, PLURAL = "leaderworkerset.x-k8s.io", "v1", "leaderworkersets"
LWS_LABEL = "leaderworkerset.sigs.k8s.io"
MULTINODE_POOL = "h100-multinode"
MULTINODE_AUTOSCALED = "h100-multinode-autoscaled"
H100 = "NVIDIA-H100-80GB-HBM3"


@pytest.fixture
def ns(core: client.CoreV1Api) -> Iterator[str]:
    with fresh_namespace(core, prefix="lws") as name:
        yield name


@pytest.fixture
def custom(api_client: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api_client)


def leaderworkerset(name: str, replicas: int = 1) -> dict[str, Any]:
    """A plain LeaderWorkerSet: groups of two pods, 8 GPUs each, on the multinode pools."""
    pod_spec = {
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/fake:1",
                "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "8"},
                    "limits": {"nvidia.com/gpu": "8"},
                },
            }
        ],
        "nodeSelector": {"nvidia.com/gpu.product": H100, MULTINODE_LABEL: "true"},
        "tolerations": [{**GPU_TAINT, "operator": "Equal"}, MULTINODE_TOLERATION],
        "terminationGracePeriodSeconds": 0,
    }
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LeaderWorkerSet",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "leaderWorkerTemplate": {"size": 2, "workerTemplate": {"spec": pod_spec}},
        },
    }


def create(custom: client.CustomObjectsApi, ns: str, name: str) -> None:
    custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, leaderworkerset(name))


def status(custom: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    return dict(obj.get("status") or {})


def group_pods(core: client.CoreV1Api, ns: str, name: str, group: int) -> list[Any]:
    """The group's pods, without those being deleted (a pod that is Terminating still reads Ready for a
    moment, as under a kubelet, but is no longer the group's)."""
    selector = f"{LWS_LABEL}/name={name},{LWS_LABEL}/group-index={group}"
    pods = core.list_namespaced_pod(ns, label_selector=selector).items
    return sorted((p for p in pods if not p.metadata.deletion_timestamp), key=lambda p: p.metadata.name)


def ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def group_ready(core: client.CoreV1Api, ns: str, name: str, group: int) -> list[Any] | None:
    pods = group_pods(core, ns, name, group)
    return pods if len(pods) == 2 and all(ready(p) for p in pods) else None


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or []}


def test_multinode_pools_are_h100_nodes_only_pods_that_ask_for_them_land_on(core: client.CoreV1Api) -> None:
    nodes = core.list_node(label_selector=f"{MULTINODE_LABEL}=true").items
    static = sorted(
        n.metadata.name for n in nodes if n.metadata.labels["specdeploy.dev/node-pool"] == MULTINODE_POOL
    )
    assert static == [f"{MULTINODE_POOL}-0", f"{MULTINODE_POOL}-1"]
    for node in nodes:
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert node.metadata.labels["nvidia.com/gpu.product"] == H100
        assert {(t.key, t.effect) for t in node.spec.taints} == {
            ("nvidia.com/gpu", "NoSchedule"),
            (MULTINODE_LABEL, "NoSchedule"),
        }


def test_a_two_node_group_lands_on_two_nodes_with_the_lws_environment_and_becomes_ready(
    lws_cluster: LocalCluster,
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    api_client: client.ApiClient,
    ns: str,
) -> None:
    started = time.monotonic()
    create(custom, ns, "tp16")
    wait_for(lambda: status(custom, ns, "tp16").get("readyReplicas") == 1, timeout=60, what="1 ready group")
    elapsed = time.monotonic() - started

    apps = client.AppsV1Api(api_client)
    leader_sts = apps.read_namespaced_stateful_set("tp16", ns)  # the leaders, one per group
    worker_sts = apps.read_namespaced_stateful_set("tp16-0", ns)  # group 0's workers, owned by its leader
    assert (leader_sts.spec.replicas, worker_sts.spec.replicas) == (1, 1)
    assert worker_sts.metadata.owner_references[0].kind == "Pod"
    assert worker_sts.metadata.owner_references[0].name == "tp16-0"
    service = core.read_namespaced_service("tp16", ns)  # headless, for the pods' DNS names
    assert service.spec.cluster_ip == "None"
    assert service.spec.selector == {f"{LWS_LABEL}/name": "tp16"}

    leader, worker = group_pods(core, ns, "tp16", 0)
    assert (leader.metadata.name, worker.metadata.name) == ("tp16-0", "tp16-0-1")
    assert leader.spec.node_name != worker.spec.node_name
    for pod in (leader, worker):
        assert core.read_node(pod.spec.node_name).metadata.labels[MULTINODE_LABEL] == "true"
        assert pod.spec.containers[0].resources.requests["nvidia.com/gpu"] == "8"
        assert pod.spec.subdomain == "tp16"
        assert (
            pod.metadata.labels[f"{LWS_LABEL}/group-key"] == leader.metadata.labels[f"{LWS_LABEL}/group-key"]
        )
        assert pod.metadata.annotations[f"{LWS_LABEL}/size"] == "2"
    # What the pod webhook adds: the group's labels and the LWS_* environment of every container.
    assert leader.metadata.labels[f"{LWS_LABEL}/worker-index"] == "0"
    assert worker.metadata.labels[f"{LWS_LABEL}/worker-index"] == "1"
    assert worker.metadata.annotations[f"{LWS_LABEL}/leader-name"] == "tp16-0"
    for pod, index in ((leader, "0"), (worker, "1")):
        env = env_of(pod)
        assert env["LWS_LEADER_ADDRESS"] == f"tp16-0.tp16.{ns}"
        assert env["LWS_GROUP_SIZE"] == "2"
        assert env["LWS_WORKER_INDEX"] == index
    final = status(custom, ns, "tp16")
    assert final["replicas"] == 1
    assert final["hpaPodSelector"] == f"{LWS_LABEL}/name=tp16,{LWS_LABEL}/worker-index=0"
    assert any(c["type"] == "Available" and c["status"] == "True" for c in final["conditions"])
    print(f"group of 2 Ready {elapsed:.1f}s after the LeaderWorkerSet was created")


def test_deleting_a_worker_pod_recreates_the_whole_group(
    lws_cluster: LocalCluster, core: client.CoreV1Api, custom: client.CustomObjectsApi, ns: str
) -> None:
    create(custom, ns, "tp16")
    leader, worker = wait_for(lambda: group_ready(core, ns, "tp16", 0), timeout=60, what="group 0 ready")
    wait_for(lambda: status(custom, ns, "tp16").get("readyReplicas") == 1, timeout=30, what="1 ready group")
    old = {leader.metadata.uid, worker.metadata.uid}
    since = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "tp16")["metadata"][
        "resourceVersion"
    ]

    core.delete_namespaced_pod("tp16-0-1", ns)
    # Every status the controller writes, from before the deletion on: ready groups 1 -> 0 -> 1.
    seen: list[int] = []
    stream = watch.Watch().stream(
        custom.list_namespaced_custom_object,
        GROUP,
        VERSION,
        ns,
        PLURAL,
        field_selector="metadata.name=tp16",
        resource_version=since,
        timeout_seconds=60,
    )
    for event in stream:
        seen.append(int((event["object"].get("status") or {}).get("readyReplicas") or 0))
        if 0 in seen and seen[-1] == 1:
            break
    assert 0 in seen, f"ready groups while the group was recreated: {seen}"
    assert seen[-1] == 1, f"ready groups while the group was recreated: {seen}"

    def renewed() -> Any:
        # The status may count the group ready again before the old leader's deletion shows.
        pods = group_ready(core, ns, "tp16", 0)
        return pods if pods and not {p.metadata.uid for p in pods} & old else None

    wait_for(renewed, timeout=60, what="group 0 ready again with both of its pods new")
    # The controller's event recorder posts asynchronously.
    wait_for(
        lambda: "RecreateGroup" in [e.reason for e in core.list_namespaced_event(ns).items],
        timeout=30,
        what="the RecreateGroup event",
    )


def test_a_second_group_gets_two_new_nodes_from_the_autoscaler_which_removes_them_when_it_goes(
    lws_cluster: LocalCluster,
    autoscaling_cluster: LocalCluster,
    *,
    core: client.CoreV1Api,
    custom: client.CustomObjectsApi,
    kubectl: Kubectl,
    ns: str,
) -> None:
    cluster = autoscaling_cluster

    def added() -> list[str]:
        return sorted(n["metadata"]["name"] for n in cluster.autoscaled_nodes(MULTINODE_AUTOSCALED))

    wait_for(lambda: not added(), timeout=90, what=f"no {MULTINODE_AUTOSCALED} nodes before the test")
    try:
        create(custom, ns, "tp16")
        wait_for(lambda: group_ready(core, ns, "tp16", 0), timeout=60, what="group 0 ready")
        started = time.monotonic()
        # The scale subresource, as an HPA or `kubectl scale` uses it.
        kubectl("scale", "leaderworkerset/tp16", "--replicas=2", "-n", ns)
        pods = wait_for(lambda: group_ready(core, ns, "tp16", 1), timeout=120, what="group 1 ready")
        grown = time.monotonic() - started
        nodes = added()
        assert len(nodes) == 2, nodes
        assert sorted(p.spec.node_name for p in pods) == nodes
        wait_for(
            lambda: status(custom, ns, "tp16").get("readyReplicas") == 2, timeout=30, what="2 ready groups"
        )
        scale = custom.get_namespaced_custom_object_scale(GROUP, VERSION, ns, PLURAL, "tp16")
        assert scale["status"]["replicas"] == 2
        assert scale["status"]["selector"] == f"{LWS_LABEL}/name=tp16,{LWS_LABEL}/worker-index=0"

        started = time.monotonic()
        kubectl("scale", "leaderworkerset/tp16", "--replicas=1", "-n", ns)
        wait_for(lambda: not group_pods(core, ns, "tp16", 1), timeout=60, what="group 1's pods deleted")
        wait_for(lambda: not added(), timeout=120, what="the autoscaler to remove the two nodes")
        shrunk = time.monotonic() - started
        assert group_ready(core, ns, "tp16", 0), "group 0 must stay while group 1 goes"
        print(f"second group Ready on 2 new nodes {grown:.1f}s after scaling to 2")
        print(f"its 2 nodes removed {shrunk:.1f}s after scaling back to 1")
    finally:
        try:
            custom.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "tp16")
        except ApiException as err:
            if err.status != 404:
                raise
        wait_for(lambda: not added(), timeout=120, what="the autoscaled nodes to be removed")
