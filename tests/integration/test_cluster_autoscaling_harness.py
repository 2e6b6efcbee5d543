"""The local cluster's Cluster Autoscaler is the real thing (kwok cloud provider): it adds and removes GPU
nodes of the pool a pending pod asks for. (The metrics half, Prometheus and prometheus-adapter serving real
servers' gauges to a real HPA, is tested end to end in test_autoscaling_chain.py.)

These tests need the harness's own cluster (its node groups): with
USE_EXISTING_CLUSTER=1 or SPECDEPLOY_AUTOSCALING=0 they are skipped, saying why. Every test leaves the shared
session cluster as it found it: its namespace is deleted and the nodes the autoscaler made are gone.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.nodepools import (
    CA_NODE_GROUP_ANNOTATION,
    GPU_TAINT,
    KWOK_ANNOTATION,
    NODE_GROUP_LABEL,
)

from tests.conftest import fresh_namespace, wait_for

H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
H100_GROUP = "h100-autoscaled"
H200_GROUP = "h200-autoscaled"
STATIC_H200_NODE = "h200-0"


@pytest.fixture
def cluster(autoscaling_cluster: LocalCluster) -> LocalCluster:
    return autoscaling_cluster


@pytest.fixture
def ns(core: client.CoreV1Api) -> Iterator[str]:
    with fresh_namespace(core, prefix="as") as name:
        yield name


def pod(name: str, *, gpus: int = 0, product: str | None = None, node: str | None = None) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": "100m", "memory": "64Mi"}
    spec: dict[str, Any] = {
        "containers": [
            {"name": "main", "image": "registry.invalid/fake:1", "resources": {"requests": requests}}
        ],
        "terminationGracePeriodSeconds": 0,
    }
    selector = {}
    if gpus:
        requests["nvidia.com/gpu"] = str(gpus)
        spec["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": str(gpus)}
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    if product:
        selector["nvidia.com/gpu.product"] = product
    if node:
        selector["kubernetes.io/hostname"] = node
    if selector:
        spec["nodeSelector"] = selector
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": spec,
    }


def running_on(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    p = core.read_namespaced_pod(name, namespace)
    return str(p.spec.node_name) if p.status.phase == "Running" and p.spec.node_name else None


def autoscaled(cluster: LocalCluster) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for node in cluster.autoscaled_nodes():
        groups.setdefault(node["metadata"]["labels"][NODE_GROUP_LABEL], []).append(node)
    return groups


def node_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


@pytest.fixture
def no_autoscaled_nodes_after(cluster: LocalCluster) -> Iterator[None]:
    """The session shares one cluster: start with no autoscaled node, and end with none (the test's
    namespace is deleted first, then the autoscaler has to remove what it added)."""
    wait_for(lambda: not cluster.autoscaled_nodes(), timeout=90, what="no autoscaled nodes before the test")
    yield
    wait_for(lambda: not cluster.autoscaled_nodes(), timeout=120, what="the autoscaled nodes to be removed")


def test_a_pending_h200_pod_gets_one_h200_node_from_the_autoscaler_which_removes_it_when_emptied(
    cluster: LocalCluster, core: client.CoreV1Api, no_autoscaled_nodes_after: None
) -> None:
    with fresh_namespace(core, prefix="as") as ns:
        # Fill the static H200 node, so that the next 8-GPU H200 pod fits nowhere.
        core.create_namespaced_pod(ns, pod("filler", gpus=8, product=H200, node=STATIC_H200_NODE))
        wait_for(
            lambda: running_on(core, ns, "filler"), timeout=30, what="the filler pod on the static H200 node"
        )

        core.create_namespaced_pod(ns, pod("wants-h200", gpus=8, product=H200))
        node_name = wait_for(
            lambda: running_on(core, ns, "wants-h200"),
            timeout=60,
            what="the H200 pod to run on an added node",
        )
        # The hostname label is a kwok Stage's, as a kubelet's would be: written after the node was made.
        wait_for(
            lambda: core.read_node(node_name).metadata.labels.get("kubernetes.io/hostname") == node_name,
            timeout=30,
            what=f"the kubernetes.io/hostname label of {node_name}",
        )
        groups = autoscaled(cluster)
        assert list(groups) == [H200_GROUP], groups
        (node,) = groups[H200_GROUP]
        assert node["metadata"]["name"] == node_name
        assert node_name.startswith(f"{H200_GROUP}-")
        labels = node["metadata"]["labels"]
        assert labels["nvidia.com/gpu.product"] == H200
        assert labels["node.kubernetes.io/instance-type"] == "p5en.48xlarge"
        assert labels["nvidia.com/gpu.count"] == "8"
        assert labels["kubernetes.io/hostname"] == node_name  # set by the kwok Stage, as a kubelet would
        assert node["metadata"]["annotations"][KWOK_ANNOTATION[0]] == KWOK_ANNOTATION[1]
        assert node["metadata"]["annotations"][CA_NODE_GROUP_ANNOTATION] == H200_GROUP
        assert node["spec"]["providerID"] == f"kwok:{node_name}"
        assert node["spec"]["taints"] == [GPU_TAINT]  # ours, not the kwok provider's own taint
        assert node["status"]["allocatable"]["nvidia.com/gpu"] == "8"
        assert node_ready(node)

        # Exactly one node, and never one of the H100 group, over three more autoscaler loops.
        loops = cluster.autoscaler_loops()

        def three_more_loops_adding_nothing() -> bool:
            groups = autoscaled(cluster)
            assert [n["metadata"]["name"] for n in groups.get(H200_GROUP, [])] == [node_name]
            assert H100_GROUP not in groups, groups
            return cluster.autoscaler_loops() >= loops + 3

        wait_for(
            three_more_loops_adding_nothing, timeout=60, interval=0.5, what="three more autoscaler loops"
        )

        core.delete_namespaced_pod("wants-h200", ns, grace_period_seconds=0)
        wait_for(
            lambda: not any(n["metadata"]["name"] == node_name for n in cluster.autoscaled_nodes()),
            timeout=90,
            what=f"the autoscaler to remove the emptied node {node_name}",
        )
        with pytest.raises(ApiException) as gone:
            core.read_node(node_name)
        assert gone.value.status == 404
        assert running_on(core, ns, "filler") == STATIC_H200_NODE  # static nodes are not the autoscaler's
    log = cluster.autoscaler_log.read_text(errors="replace")
    assert H200_GROUP in log
