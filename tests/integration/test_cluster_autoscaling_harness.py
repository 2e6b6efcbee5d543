"""The local cluster's autoscaling pieces are the real thing: custom metrics served through API aggregation by
the custom-metrics-apiserver test adapter, the controller-manager's HPA acting on them, and the Cluster
Autoscaler (kwok cloud provider) adding and removing GPU nodes of the pool a pending pod asks for.

These tests need the harness's own cluster (its metric write endpoint and node groups): with
USE_EXISTING_CLUSTER=1 or SPECDEPLOY_AUTOSCALING=0 they are skipped, saying why. Every test leaves the shared
session cluster as it found it: its namespace is deleted and the nodes the autoscaler made are gone.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from localcluster import CA_NODE_GROUP_ANNOTATION, GPU_TAINT, KWOK_ANNOTATION, NODE_GROUP_LABEL, LocalCluster

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


def custom_metric_items(cluster: LocalCluster, version: str, namespace: str, metric: str) -> list[Any]:
    path = f"/apis/custom.metrics.k8s.io/{version}/namespaces/{namespace}/pods/*/{metric}"
    items: list[Any] = cluster.api("GET", path)["items"]
    return items


def test_a_written_pod_metric_is_served_by_the_custom_metrics_api(
    cluster: LocalCluster, core: client.CoreV1Api, ns: str
) -> None:
    core.create_namespaced_pod(ns, pod("worker"))
    wait_for(lambda: running_on(core, ns, "worker"), timeout=30, what="the kwok pod to run")

    cluster.set_pod_metric(ns, "worker", "queue_seconds", "300m")

    (item,) = custom_metric_items(cluster, "v1beta2", ns, "queue_seconds")
    assert item["describedObject"]["kind"] == "Pod"
    assert item["describedObject"]["name"] == "worker"
    assert item["describedObject"]["namespace"] == ns
    assert item["metric"]["name"] == "queue_seconds"
    assert item["value"] == "300m"
    # The same value through the older API version the HPA controller can also use.
    (old,) = custom_metric_items(cluster, "v1beta1", ns, "queue_seconds")
    assert (old["metricName"], old["value"]) == ("queue_seconds", "300m")

    cluster.set_pod_metric(ns, "worker", "queue_seconds", "7")
    (item,) = custom_metric_items(cluster, "v1beta2", ns, "queue_seconds")
    assert item["value"] == "7"
    assert custom_metric_items(cluster, "v1beta2", ns, "never_written") == []


def test_an_object_metric_of_a_custom_resource_installed_after_the_adapter_started_is_served(
    cluster: LocalCluster, api_client: client.ApiClient, ns: str
) -> None:
    group, plural = "harness.specdeploy.dev", f"widgets{ns.replace('-', '')}"
    crd_name = f"{plural}.{group}"
    extensions = client.ApiextensionsV1Api(api_client)
    extensions.create_custom_resource_definition(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": crd_name},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"plural": plural, "singular": plural[:-1], "kind": "HarnessWidget"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        }
    )
    try:
        objects = client.CustomObjectsApi(api_client)
        wait_for(
            lambda: _created(objects, group, ns, plural),
            timeout=30,
            what="the custom resource to be served",
        )

        def served() -> Any:
            cluster.set_metric(crd_name, "w1", "queue_seconds", "42", namespace=ns)
            try:
                out = cluster.api(
                    "GET", f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/{crd_name}/w1/queue_seconds"
                )
            except OSError:  # not known to the adapter's REST mapping yet: an error answer
                return None
            return out

        result = wait_for(
            served, timeout=45, interval=1, what="the adapter to serve the custom resource's metric"
        )
        (item,) = result["items"]
        assert item["describedObject"]["name"] == "w1"
        assert item["describedObject"]["apiVersion"] == f"{group}/v1"
        assert item["value"] == "42"
    finally:
        extensions.delete_custom_resource_definition(crd_name)


def _created(objects: client.CustomObjectsApi, group: str, ns: str, plural: str) -> bool:
    try:
        objects.create_namespaced_custom_object(
            group,
            "v1",
            ns,
            plural,
            {"apiVersion": f"{group}/v1", "kind": "HarnessWidget", "metadata": {"name": "w1"}},
        )
    except ApiException as err:
        if err.status == 409:
            return True
        if err.status == 404:  # the CRD is not served yet
            return False
        raise
    return True


def test_a_real_hpa_scales_a_deployment_on_a_pods_metric_from_the_adapter(
    cluster: LocalCluster, api_client: client.ApiClient, core: client.CoreV1Api, ns: str
) -> None:
    apps = client.AppsV1Api(api_client)
    template = pod("web")
    apps.create_namespaced_deployment(
        ns,
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {"metadata": {"labels": {"app": "web"}}, "spec": template["spec"]},
            },
        },
    )
    first = wait_for(
        lambda: [
            p
            for p in core.list_namespaced_pod(ns, label_selector="app=web").items
            if p.status.phase == "Running"
        ],
        timeout=30,
        what="the first replica to run",
    )[0].metadata.name
    # Five queued requests on the one replica, target one per replica: the HPA wants 5, capped at 3.
    cluster.set_pod_metric(ns, first, "queue_depth", "5")
    client.AutoscalingV2Api(api_client).create_namespaced_horizontal_pod_autoscaler(
        ns,
        {
            "apiVersion": "autoscaling/v2",
            "kind": "HorizontalPodAutoscaler",
            "metadata": {"name": "web"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"},
                "minReplicas": 1,
                "maxReplicas": 3,
                "metrics": [
                    {
                        "type": "Pods",
                        "pods": {
                            "metric": {"name": "queue_depth"},
                            "target": {"type": "AverageValue", "averageValue": "1"},
                        },
                    }
                ],
            },
        },
    )

    def scaled() -> Any:
        hpa = client.AutoscalingV2Api(api_client).read_namespaced_horizontal_pod_autoscaler("web", ns)
        replicas = apps.read_namespaced_deployment("web", ns).spec.replicas
        return hpa if replicas == 3 and hpa.status.current_metrics else None

    hpa = wait_for(scaled, timeout=60, what="the HPA to scale the Deployment to 3 on queue_depth")
    assert hpa.status.desired_replicas == 3
    (current,) = hpa.status.current_metrics
    assert current.type == "Pods"
    assert current.pods.metric.name == "queue_depth"
    assert current.pods.current.average_value == "5"
    conditions = {c.type: (c.status, c.reason) for c in hpa.status.conditions}
    assert conditions["ScalingActive"] == ("True", "ValidMetricFound")
    assert conditions["ScalingLimited"] == ("True", "TooManyReplicas")
    wait_for(
        lambda: (apps.read_namespaced_deployment("web", ns).status.ready_replicas or 0) == 3,
        timeout=30,
        what="3 ready replicas",
    )


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

        started = time.monotonic()
        core.create_namespaced_pod(ns, pod("wants-h200", gpus=8, product=H200))
        node_name = wait_for(
            lambda: running_on(core, ns, "wants-h200"),
            timeout=60,
            what="the H200 pod to run on an added node",
        )
        scale_up = time.monotonic() - started
        assert scale_up < 30, f"scale-up took {scale_up:.0f}s"
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

        # Exactly one node, and never one of the H100 group, over several more autoscaler loops.
        for _ in range(6):
            time.sleep(1)
            groups = autoscaled(cluster)
            assert [n["metadata"]["name"] for n in groups.get(H200_GROUP, [])] == [node_name]
            assert H100_GROUP not in groups, groups

        started = time.monotonic()
        core.delete_namespaced_pod("wants-h200", ns, grace_period_seconds=0)
        wait_for(
            lambda: not any(n["metadata"]["name"] == node_name for n in cluster.autoscaled_nodes()),
            timeout=90,
            what=f"the autoscaler to remove the emptied node {node_name}",
        )
        scale_down = time.monotonic() - started
        assert scale_down < 60, f"scale-down took {scale_down:.0f}s"
        with pytest.raises(ApiException) as gone:
            core.read_node(node_name)
        assert gone.value.status == 404
        assert running_on(core, ns, "filler") == STATIC_H200_NODE  # static nodes are not the autoscaler's
    log = cluster.autoscaler_log.read_text(errors="replace")
    assert H200_GROUP in log
