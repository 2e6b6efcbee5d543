"""The local cluster is a real Kubernetes: real scheduler, controllers, garbage collection, CRDs.

These tests run against whatever ``kubeconfig`` names (the local cluster by default) and need the default
node pools of ``hack/cluster/nodepools.yaml``: 2 x 8 H100 nodes, 1 x 8 H200 node, 1 H100 node split into 16
MIG 3g.40gb slices, 1 CPU node (and 2 x 8 H100 nodes for replicas that span nodes, kept apart by their own
label and taint: tests/integration/test_leaderworkerset_cluster.py).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException
from specdeploy_localcluster.nodepools import MULTINODE_LABEL, NODE_GROUP_LABEL

from tests.conftest import Kubectl, wait_for

H100 = "NVIDIA-H100-80GB-HBM3"
H200 = "NVIDIA-H200"
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def gpu_pod_spec(
    gpus: int, product: str | None = None, node: str | None = None, tolerate: bool = True
) -> dict[str, Any]:
    selector = {}
    if product:
        selector["nvidia.com/gpu.product"] = product
    if node:
        selector["kubernetes.io/hostname"] = node
    return {
        "containers": [
            {
                "name": "main",
                "image": "registry.invalid/fake:1",
                "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)},
                    "limits": {"nvidia.com/gpu": str(gpus)},
                },
            }
        ],
        "nodeSelector": selector,
        "tolerations": [GPU_TOLERATION] if tolerate else [],
    }


def pod_manifest(
    name: str, spec: dict[str, Any], annotations: dict[str, str] | None = None
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": spec,
    }


def deployment_manifest(name: str, replicas: int, pod_spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": pod_spec},
        },
    }


def pods_by_phase(core: client.CoreV1Api, namespace: str, selector: str = "") -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for pod in core.list_namespaced_pod(namespace, label_selector=selector).items:
        out.setdefault(pod.status.phase, []).append(pod)
    return out


def scheduled_false_message(pod: Any) -> str | None:
    for cond in pod.status.conditions or []:
        if cond.type == "PodScheduled" and cond.status == "False" and cond.reason == "Unschedulable":
            return str(cond.message)
    return None


def test_apiserver_reports_the_pinned_kubernetes_version(api_client: client.ApiClient) -> None:
    info = client.VersionApi(api_client).get_code()
    assert info.git_version.startswith("v1.3"), info.git_version
    assert info.major == "1"
    assert int(info.minor.rstrip("+")) >= 33


def test_default_gpu_pools_expose_capacity_labels_and_taint(core: client.CoreV1Api) -> None:
    # The static pools but the multinode one (its own test); nodes the Cluster Autoscaler added for another
    # test may still be on their way out.
    selector = f"!{NODE_GROUP_LABEL},!{MULTINODE_LABEL}"
    nodes = {n.metadata.name: n for n in core.list_node(label_selector=selector).items}
    gpu_nodes = [n for n in nodes.values() if "nvidia.com/gpu" in (n.status.capacity or {})]
    products = sorted(n.metadata.labels["nvidia.com/gpu.product"] for n in gpu_nodes)
    assert products == [H100, H100, H200]
    mig = [n for n in nodes.values() if "nvidia.com/mig-3g.40gb" in (n.status.capacity or {})]
    assert [n.metadata.labels["nvidia.com/gpu.product"] for n in mig] == [H100]
    assert mig[0].status.allocatable["nvidia.com/mig-3g.40gb"] == "16"
    assert [(t.key, t.effect) for t in mig[0].spec.taints or []] == [("nvidia.com/gpu", "NoSchedule")]
    for node in gpu_nodes:
        assert node.status.capacity["nvidia.com/gpu"] == "8"
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        assert node.metadata.labels["nvidia.com/gpu.count"] == "8"
        assert node.metadata.labels["node.kubernetes.io/instance-type"]
        assert [(t.key, t.effect) for t in node.spec.taints or []] == [("nvidia.com/gpu", "NoSchedule")]
        ready = {c.type: c.status for c in node.status.conditions}
        assert ready["Ready"] == "True"
    cpu_nodes = [n for n in nodes.values() if n.metadata.labels.get("specdeploy.dev/node-pool") == "cpu"]
    assert len(cpu_nodes) == 1
    assert "nvidia.com/gpu" not in cpu_nodes[0].status.capacity
    assert not cpu_nodes[0].spec.taints


def test_gpu_deployment_lands_only_on_nodes_of_the_requested_product(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    apps = client.AppsV1Api(api_client)
    apps.create_namespaced_deployment(
        namespace, deployment_manifest("gpu-app", 3, gpu_pod_spec(2, product=H100))
    )

    def ready_replicas() -> bool:
        dep = apps.read_namespaced_deployment("gpu-app", namespace)
        return (dep.status.ready_replicas or 0) == 3

    wait_for(ready_replicas, timeout=60, what="3 ready replicas")
    pods = core.list_namespaced_pod(namespace, label_selector="app=gpu-app").items
    assert len(pods) == 3
    for pod in pods:
        node = core.read_node(pod.spec.node_name)
        assert node.metadata.labels["nvidia.com/gpu.product"] == H100
        assert pod.status.phase == "Running"
        assert pod.status.pod_ip


def test_pod_wanting_more_gpus_than_any_node_stays_pending_with_scheduler_reason(
    core: client.CoreV1Api, namespace: str
) -> None:
    core.create_namespaced_pod(namespace, pod_manifest("too-big", gpu_pod_spec(9)))
    message = wait_for(
        lambda: scheduled_false_message(core.read_namespaced_pod("too-big", namespace)),
        timeout=30,
        what="the scheduler to mark the pod Unschedulable",
    )
    assert "Insufficient nvidia.com/gpu" in message
    assert core.read_namespaced_pod("too-big", namespace).status.phase == "Pending"


def test_gpu_pod_without_toleration_is_kept_off_tainted_gpu_nodes(
    core: client.CoreV1Api, namespace: str
) -> None:
    core.create_namespaced_pod(namespace, pod_manifest("untolerated", gpu_pod_spec(1, tolerate=False)))
    message = wait_for(
        lambda: scheduled_false_message(core.read_namespaced_pod("untolerated", namespace)),
        timeout=30,
        what="the scheduler to refuse the untolerated GPU pod",
    )
    assert "untolerated taint" in message


def test_three_four_gpu_pods_on_one_eight_gpu_node_two_run_one_pends(
    core: client.CoreV1Api, namespace: str
) -> None:
    for i in range(3):
        core.create_namespaced_pod(
            namespace, pod_manifest(f"quarter-{i}", gpu_pod_spec(4, product=H200, node="h200-0"))
        )

    def settled() -> dict[str, list[Any]] | None:
        phases = pods_by_phase(core, namespace)
        pending = phases.get("Pending", [])
        if len(phases.get("Running", [])) == 2 and len(pending) == 1 and scheduled_false_message(pending[0]):
            return phases
        return None

    phases = wait_for(settled, timeout=60, what="two Running and one Unschedulable pod")
    assert {p.spec.node_name for p in phases["Running"]} == {"h200-0"}
    assert "Insufficient nvidia.com/gpu" in str(scheduled_false_message(phases["Pending"][0]))


def job_manifest(name: str, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"annotations": annotations or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "build", "image": "registry.invalid/builder:1"}],
                },
            },
        },
    }


def job_condition(batch: client.BatchV1Api, name: str, namespace: str, kind: str) -> Any:
    job = batch.read_namespaced_job(name, namespace)
    for cond in job.status.conditions or []:
        if cond.type == kind and cond.status == "True":
            return cond
    return None


def test_job_pod_completes_and_the_job_succeeds(api_client: client.ApiClient, namespace: str) -> None:
    batch = client.BatchV1Api(api_client)
    batch.create_namespaced_job(namespace, job_manifest("ok", {"sim.specdeploy.dev/complete-delay": "1s"}))
    wait_for(lambda: job_condition(batch, "ok", namespace, "Complete"), timeout=60, what="Job Complete")
    assert batch.read_namespaced_job("ok", namespace).status.succeeded == 1


def test_job_pod_with_failure_annotation_fails_with_its_termination_message(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    batch = client.BatchV1Api(api_client)
    annotations = {
        "sim.specdeploy.dev/fail-exit-code": "3",
        "sim.specdeploy.dev/fail-message": "trtllm-build: out of memory",
    }
    batch.create_namespaced_job(namespace, job_manifest("broken", annotations))
    wait_for(lambda: job_condition(batch, "broken", namespace, "Failed"), timeout=60, what="Job Failed")
    pods = core.list_namespaced_pod(namespace, label_selector="job-name=broken").items
    assert len(pods) == 1
    state = pods[0].status.container_statuses[0].state.terminated
    assert state.exit_code == 3
    assert state.message == "trtllm-build: out of memory"
    assert pods[0].status.phase == "Failed"


def test_a_deleted_pod_stays_ready_while_its_containers_stop_then_ends_succeeded_and_goes(
    core: client.CoreV1Api, namespace: str
) -> None:
    spec = {"nodeSelector": {"type": "kwok"}, "containers": [{"name": "c", "image": "registry.invalid/a:1"}]}
    stops = pod_manifest("stops", spec, {"sim.specdeploy.dev/stop-delay": "3s"})
    core.create_namespaced_pod(namespace, stops)
    wait_for(lambda: pods_by_phase(core, namespace).get("Running"), what="the pod running")
    since = core.delete_namespaced_pod("stops", namespace).metadata.resource_version
    # Every change from the deletion on, as a controller's watch sees them.
    seen: list[tuple[str, str, bool]] = []
    pods: list[Any] = []
    for event in watch.Watch().stream(
        core.list_namespaced_pod,
        namespace,
        field_selector="metadata.name=stops",
        resource_version=since,
        timeout_seconds=30,
    ):
        pod = event["object"]
        ready = any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or ())
        seen.append((event["type"], pod.status.phase, ready))
        pods.append(pod)
        if event["type"] == "DELETED":
            break
    stopped = next(i for i, (_, phase, _) in enumerate(seen) if phase != "Running")
    assert all(ready for _, _, ready in seen[:stopped]), f"Ready until its containers stopped: {seen}"
    assert {(phase, ready) for _, phase, ready in seen[stopped:]} == {("Succeeded", False)}, seen
    assert seen[-1][0] == "DELETED", seen
    assert seen[stopped][0] == "MODIFIED", f"reported Succeeded, then gone: {seen}"
    # The containers took the stop delay, by the pod's own times (whole seconds): deleted at its deletion
    # timestamp less its grace period, finished when its container says.
    pod = pods[stopped]
    deleted_at = pod.metadata.deletion_timestamp - timedelta(
        seconds=pod.metadata.deletion_grace_period_seconds
    )
    finished_at = pod.status.container_statuses[0].state.terminated.finished_at
    assert finished_at - deleted_at >= timedelta(seconds=2), f"stopped {finished_at}, deleted {deleted_at}"


def test_deleting_a_deployment_garbage_collects_its_replicasets_and_pods(
    api_client: client.ApiClient, core: client.CoreV1Api, namespace: str
) -> None:
    apps = client.AppsV1Api(api_client)
    pod_spec = {
        # kwok nodes only: on kind, the real node would try to pull the image.
        "nodeSelector": {"type": "kwok"},
        "containers": [{"name": "c", "image": "registry.invalid/app:1"}],
    }
    apps.create_namespaced_deployment(namespace, deployment_manifest("cpu-app", 2, pod_spec))
    wait_for(
        lambda: len(pods_by_phase(core, namespace, "app=cpu-app").get("Running", [])) == 2,
        what="2 running pods",
    )
    apps.delete_namespaced_deployment("cpu-app", namespace, propagation_policy="Background")
    wait_for(
        lambda: (
            not apps.list_namespaced_replica_set(namespace).items
            and not core.list_namespaced_pod(namespace).items
        ),
        timeout=60,
        what="the garbage collector to remove ReplicaSets and pods",
    )


def test_deleting_a_namespace_removes_everything_it_holds(
    api_client: client.ApiClient, core: client.CoreV1Api
) -> None:
    name = "t-doomed"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    core.create_namespaced_config_map(
        name, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="cfg"), data={"a": "b"})
    )
    wait_for(
        lambda: _exists(lambda: core.read_namespaced_service_account("default", name)),
        what="default ServiceAccount",
    )
    core.create_namespaced_pod(name, pod_manifest("p", gpu_pod_spec(1, product=H100)))
    wait_for(lambda: core.read_namespaced_pod("p", name).status.phase == "Running", what="pod Running")
    core.delete_namespace(name)
    wait_for(
        lambda: not _exists(lambda: core.read_namespace(name)),
        timeout=90,
        what="the namespace controller to empty and remove the namespace",
    )
    assert not core.list_pod_for_all_namespaces(field_selector=f"metadata.namespace={name}").items


def _exists(read: Any) -> bool:
    try:
        read()
    except ApiException as err:
        if err.status == 404:
            return False
        raise
    return True


WIDGET_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "widgets.test.specdeploy.dev"},
    "spec": {
        "group": "test.specdeploy.dev",
        "scope": "Namespaced",
        "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
        "versions": [
            {
                "name": "v1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {
                    "openAPIV3Schema": {
                        "type": "object",
                        "properties": {
                            "spec": {"type": "object", "properties": {"size": {"type": "integer"}}},
                            "status": {"type": "object", "properties": {"phase": {"type": "string"}}},
                        },
                    }
                },
            }
        ],
    },
}


@pytest.fixture(scope="module")
def widget_crd(api_client: client.ApiClient, kubectl: Kubectl) -> str:
    ext = client.ApiextensionsV1Api(api_client)
    if not _exists(lambda: ext.read_custom_resource_definition("widgets.test.specdeploy.dev")):
        ext.create_custom_resource_definition(WIDGET_CRD)
    kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd/widgets.test.specdeploy.dev")
    return "widgets"


def test_custom_resource_with_status_subresource_round_trips(
    api_client: client.ApiClient, widget_crd: str, namespace: str
) -> None:
    custom = client.CustomObjectsApi(api_client)
    group, version = "test.specdeploy.dev", "v1"

    def create() -> bool:
        try:
            custom.create_namespaced_custom_object(
                group,
                version,
                namespace,
                widget_crd,
                {
                    "apiVersion": f"{group}/{version}",
                    "kind": "Widget",
                    "metadata": {"name": "w"},
                    "spec": {"size": 3},
                    "status": {"phase": "ignored-on-create"},
                },
            )
        except ApiException as err:
            if err.status == 404:  # discovery of a just-established CRD can lag a moment
                return False
            raise
        return True

    wait_for(create, timeout=30, what="the Widget to be created")
    obj = custom.get_namespaced_custom_object(group, version, namespace, widget_crd, "w")
    assert obj["spec"] == {"size": 3}
    assert "status" not in obj  # the status subresource ignores status on create
    obj["status"] = {"phase": "Ready"}
    custom.replace_namespaced_custom_object_status(group, version, namespace, widget_crd, "w", obj)
    obj = custom.get_namespaced_custom_object(group, version, namespace, widget_crd, "w")
    assert obj["status"] == {"phase": "Ready"}
    obj["spec"]["size"] = 4
    obj["status"] = {"phase": "changed-through-main-resource"}
    custom.replace_namespaced_custom_object(group, version, namespace, widget_crd, "w", obj)
    obj = custom.get_namespaced_custom_object(group, version, namespace, widget_crd, "w")
    assert obj["spec"] == {"size": 4}
    assert obj["status"] == {"phase": "Ready"}  # the main resource cannot write status
