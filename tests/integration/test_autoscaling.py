"""Autoscaling against the real control plane: the operator's HorizontalPodAutoscaler (or KEDA
ScaledObject) on the SpeculativeDeployment's scale subresource, and the Cluster Autoscaler's kwok provider
adding and removing GPU nodes for replicas that do not fit. The load signal itself (real servers →
Prometheus → prometheus-adapter → HPA) is tested on real CPU pods in test_autoscaling_chain.py."""

from __future__ import annotations

import copy
import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, watch
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.nodepools import NODE_GROUP_LABEL
from urllib3.exceptions import ProtocolError

from tests.conftest import OPERATOR_NAMESPACE_PREFIX, Kubectl, fresh_namespace, wait_for
from tests.integration.test_operator import Cluster, condition, example

pytestmark = pytest.mark.usefixtures("operator")

REPO = Path(__file__).resolve().parents[2]
QUEUE_SECONDS = "specdeploy_queue_seconds"
QUEUE_DEPTH = "specdeploy_queue_depth"
H200 = "NVIDIA-H200"
H200_POOL = "h200-autoscaled"  # the autoscaled pool of hack/cluster/nodepools.yaml with that product


@pytest.fixture
def cluster(kubectl: Kubectl, api_client: client.ApiClient) -> Iterator[Cluster]:
    with fresh_namespace(client.CoreV1Api(api_client), OPERATOR_NAMESPACE_PREFIX) as namespace:
        yield Cluster(kubectl, api_client, namespace)


@pytest.fixture
def harness(autoscaling_cluster: LocalCluster) -> LocalCluster:
    return autoscaling_cluster


def hpa(cluster: Cluster, name: str) -> Any | None:
    api = client.AutoscalingV2Api(cluster.core.api_client)
    try:
        return api.read_namespaced_horizontal_pod_autoscaler(name, cluster.namespace)
    except client.ApiException as error:
        if error.status == 404:
            return None
        raise


def replicas(cluster: Cluster, name: str) -> int:
    return int(cluster.sdep(name)["spec"]["replicas"])


def reasons(cluster: Cluster) -> set[str]:
    events = cluster.core.list_namespaced_event(cluster.namespace).items
    return {e.reason for e in events if e.source and e.source.component == "specdeploy-operator"}


def status_when(
    cluster: Cluster, name: str, predicate: Callable[[dict[str, Any]], Any]
) -> Callable[[], dict[str, Any] | None]:
    """For `wait_for`: the deployment's status once `predicate(status)` holds."""

    def check() -> dict[str, Any] | None:
        status = cluster.status(name)
        return status if predicate(status) else None

    return check


def remove_autoscaling(cluster: Cluster, name: str) -> None:
    """`spec.autoscaling` removed, as a user would with kubectl."""
    patch = '[{"op": "remove", "path": "/spec/autoscaling"}]'
    cluster.kubectl("patch", "sdep", name, "-n", cluster.namespace, "--type=json", "-p", patch)


def autoscaled(prefix: str, autoscaling: dict[str, Any], **spec: Any) -> dict[str, Any]:
    doc = copy.deepcopy(example(prefix))
    doc["spec"].pop("replicas", None)
    doc["spec"]["autoscaling"] = autoscaling
    for key, value in spec.items():
        doc["spec"][key] = {**doc["spec"].get(key, {}), **value}
    return doc


# -- the autoscaler object ------------------------------------------------------------------------------


def test_autoscaling_creates_an_hpa_on_the_scale_subresource_and_removing_it_deletes_the_hpa(
    cluster: Cluster,
) -> None:
    name = cluster.apply(example("08"))
    status = cluster.wait_phase(name, "Ready", timeout=120)
    found = wait_for(lambda: hpa(cluster, name), timeout=30, what="the HorizontalPodAutoscaler")
    assert found.spec.scale_target_ref.to_dict() == {
        "api_version": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "name": name,
    }
    assert (found.spec.min_replicas, found.spec.max_replicas) == (1, 8)
    metric = found.spec.metrics[0]
    assert (metric.type, metric.pods.metric.name) == ("Pods", QUEUE_SECONDS)
    assert (metric.pods.target.type, metric.pods.target.average_value) == ("AverageValue", "10")
    assert found.spec.behavior.scale_down.stabilization_window_seconds == 600
    owner = found.metadata.owner_references[0]
    assert (owner.kind, owner.name, owner.controller) == ("SpeculativeDeployment", name, True)
    auto = status["autoscaler"]
    assert (auto["kind"], auto["name"], auto["metric"], auto["target"]) == (
        "HorizontalPodAutoscaler",
        name,
        QUEUE_SECONDS,
        "10",
    )
    # The HPA controller found the pods through `status.selector` of the scale subresource.
    scale = json.loads(
        cluster.kubectl(
            "get",
            "--raw",
            f"/apis/specdeploy.dev/v1alpha1/namespaces/{cluster.namespace}/"
            f"speculativedeployments/{name}/scale",
        ).stdout
    )
    assert scale["status"]["selector"] == status["selector"]
    # The serving pods drain for the deployment's grace period.
    pod = cluster.pods(status["selector"])[0]
    assert pod.spec.termination_grace_period_seconds == 120

    remove_autoscaling(cluster, name)
    wait_for(lambda: hpa(cluster, name) is None, timeout=30, what="the HPA to be deleted")
    status = wait_for(
        status_when(cluster, name, lambda s: "autoscaler" not in s),
        timeout=30,
        what="status.autoscaler to go",
    )
    assert status["phase"] == "Ready"


def test_the_keda_engine_says_when_keda_is_missing_then_creates_a_scaled_object_its_crd_accepts(
    cluster: Cluster, kubectl: Kubectl
) -> None:
    doc = autoscaled(
        "02",
        {
            "engine": "keda",
            "minReplicas": 0,
            "maxReplicas": 3,
            "keda": {"serverAddress": "http://prometheus.monitoring.svc:9090"},
        },
    )
    crds = subprocess.run(
        ["bash", str(REPO / "hack" / "keda-crds.sh")], check=True, capture_output=True, text=True
    ).stdout.strip()
    scaled_object_crd = Path(crds) / "keda.sh_scaledobjects.yaml"
    # KEDA is not installed (yet): the status says so, an event too, and nothing else suffers.
    kubectl("delete", "-f", str(scaled_object_crd), "--ignore-not-found", "--wait=true")
    name = cluster.apply(doc)
    status = wait_for(
        status_when(cluster, name, lambda s: (s.get("autoscaler") or {}).get("message")),
        timeout=60,
        what="status.autoscaler.message",
    )
    assert "is KEDA installed?" in status["autoscaler"]["message"]
    assert status["autoscaler"]["kind"] == "ScaledObject"
    wait_for(lambda: "AutoscalerFailed" in reasons(cluster), timeout=30, what="the AutoscalerFailed event")
    cluster.wait_phase(name, "Ready", timeout=120)

    kubectl("apply", "--server-side", "-f", str(scaled_object_crd))
    try:
        kubectl("wait", "--for=condition=Established", "crd/scaledobjects.keda.sh", "--timeout=30s")
        # A change of the spec is picked up at once (otherwise the retry comes within a minute).
        cluster.patch(name, {"autoscaling": {"keda": {"pollingIntervalSeconds": 5}}})

        def scaled_object() -> dict[str, Any] | None:
            try:
                obj: dict[str, Any] = cluster.custom.get_namespaced_custom_object(
                    "keda.sh", "v1alpha1", cluster.namespace, "scaledobjects", name
                )
            except client.ApiException as error:
                if error.status == 404:
                    return None
                raise
            return obj

        obj = wait_for(scaled_object, timeout=30, what="the ScaledObject")
        # Applied with strict field validation against KEDA's CRD: every field the operator rendered is kept.
        spec = obj["spec"]
        assert spec["scaleTargetRef"] == {
            "apiVersion": "specdeploy.dev/v1alpha1",
            "kind": "SpeculativeDeployment",
            "name": name,
        }
        assert (spec["minReplicaCount"], spec["maxReplicaCount"], spec["pollingInterval"]) == (0, 3, 5)
        trigger = spec["triggers"][0]
        assert trigger["type"] == "prometheus"
        assert trigger["metadata"]["query"] == (
            f'sum({QUEUE_SECONDS}{{namespace="{cluster.namespace}",pod=~"{name}-[a-z0-9]+-[a-z0-9]+"}})'
        )
        assert (
            spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
                "stabilizationWindowSeconds"
            ]
            == 600
        )
        wait_for(
            lambda: "message" not in (cluster.status(name).get("autoscaler") or {"message": 1}),
            timeout=30,
            what="the autoscaler message to clear",
        )
        assert hpa(cluster, name) is None  # KEDA makes its own HPA; the operator makes none

        remove_autoscaling(cluster, name)
        wait_for(lambda: scaled_object() is None, timeout=30, what="the ScaledObject to be deleted")
    finally:
        kubectl("delete", "-f", str(scaled_object_crd), "--ignore-not-found", "--wait=false")


# -- the HPA at work: metrics from the custom metrics API ----------------------------------------------


@contextmanager
def status_history(cluster: Cluster, name: str) -> Iterator[list[dict[str, Any]]]:
    """Every status the deployment has while the block runs, from a watch: a state the simulated cluster
    passes through in a second (a GPU node is "provisioned" at once) is seen too, where polling could miss it.
    """
    seen: list[dict[str, Any]] = []
    stop = threading.Event()
    stream = watch.Watch()

    def loop() -> None:
        while not stop.is_set():
            try:
                events = list_events()
                for event in events:
                    seen.append(copy.deepcopy(event["object"].get("status") or {}))
                    if stop.is_set():
                        break
            except (ProtocolError, client.ApiException):
                if stop.is_set():  # the watch was cut off by stop(): expected
                    return
                raise

    def list_events() -> Iterator[dict[str, Any]]:
        return stream.stream(  # type: ignore[no-any-return]
            cluster.custom.list_namespaced_custom_object,
            "specdeploy.dev",
            "v1alpha1",
            cluster.namespace,
            "speculativedeployments",
            field_selector=f"metadata.name={name}",
            timeout_seconds=5,
        )

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        stop.set()
        stream.stop()
        thread.join(timeout=10)


# -- the Cluster Autoscaler: GPU nodes on demand -----------------------------------------------------------


def gpu_node_groups(core: client.CoreV1Api) -> dict[str, str]:
    """Node name -> node group, for the nodes the Cluster Autoscaler made."""
    out: dict[str, str] = {}
    for node in core.list_node().items:
        group = (node.metadata.labels or {}).get(NODE_GROUP_LABEL)
        if group:
            out[node.metadata.name] = group
    return out


def scale(cluster: Cluster, name: str, count: int) -> None:
    """What an HPA (or KEDA) writes: `spec.replicas` through the scale subresource."""
    cluster.kubectl("scale", f"sdep/{name}", "-n", cluster.namespace, f"--replicas={count}")


def test_more_replicas_add_a_gpu_node_of_the_right_pool_and_fewer_take_the_node_away(
    cluster: Cluster, harness: LocalCluster
) -> None:
    # The GPU half of the autoscaling chain (its metrics half runs on real CPU pods in
    # test_autoscaling_chain.py: no real server runs on a simulated GPU node, so nothing here could produce
    # a load signal). Replicas change through the scale subresource, as the HPA does there.
    # One replica takes a whole 8-GPU H200 node: the only static H200 node holds the first, the second
    # needs a node from the H200 pool. Example 06 (EAGLE-3 on the PyTorch backend, TP8) builds no engine, so
    # no build pod competes for the H200 GPUs (a build that waits for a GPU gets an autoscaled node too, and
    # the first replica could then land on it).
    def h200_nodes() -> str:
        nodes = [n["metadata"]["name"] for n in harness.autoscaled_nodes(H200_POOL)]
        pods = cluster.kubectl(
            "get", "pods", "-A", "-o", "wide", "--field-selector=status.phase!=Succeeded"
        ).stdout
        return f"{nodes}; pods:\n{pods}"

    try:
        wait_for(
            lambda: not harness.autoscaled_nodes(H200_POOL),
            timeout=120,
            what="no autoscaled H200 node left by earlier tests",
        )
    except BaseException:
        print(h200_nodes())
        raise
    doc = copy.deepcopy(example("06"))
    doc["spec"]["placement"] = {**doc["spec"].get("placement", {}), "gpuProduct": H200}
    doc["spec"]["replicas"] = 1
    name = cluster.apply(doc)
    status = cluster.wait_phase(name, "Ready", timeout=120)
    assert status["gpusPerReplica"] == 8
    assert "engines" not in status
    selector = status["selector"]
    (first,) = cluster.pods(selector)
    before = gpu_node_groups(cluster.core)

    with status_history(cluster, name) as history:
        scale(cluster, name, 2)
        try:
            pending = wait_for(
                lambda: next((s for s in history if s.get("capacityPendingReplicas")), None),
                timeout=60,
                what="CapacityPending",
            )
        except BaseException:
            out = cluster.kubectl("get", "pods,hpa,sdep", "-n", cluster.namespace, "-o", "wide").stdout
            nodes = cluster.kubectl("get", "nodes", "-L", "nvidia.com/gpu.product").stdout
            events = cluster.kubectl("get", "events", "-n", cluster.namespace).stdout
            phases = [(h.get("phase"), h.get("replicas"), h.get("readyReplicas")) for h in history]
            print(f"{out}\n{nodes}\n{events}\n{phases}")
            raise
        assert replicas(cluster, name) == 2
        degraded = condition(pending, "Degraded")
        assert degraded["reason"] == "CapacityPending"
        assert "Insufficient nvidia.com/gpu" in degraded["message"]
        assert degraded["message"].startswith("1 of 2 replicas wait for capacity (8 nvidia.com/gpu each)")
        assert pending["capacityPendingReplicas"] == 1
        wait_for(lambda: "CapacityPending" in reasons(cluster), timeout=30, what="the CapacityPending event")

        status = cluster.wait_phase(name, "Ready", timeout=120, since_generation=False)
        assert status["readyReplicas"] == 2
        assert "capacityPendingReplicas" not in status
        added = {n: g for n, g in gpu_node_groups(cluster.core).items() if n not in before}
        assert len(added) == 1, added
        node_name, group = next(iter(added.items()))
        node = cluster.core.read_node(node_name)
        assert node.metadata.labels["nvidia.com/gpu.product"] == H200
        assert node.status.capacity["nvidia.com/gpu"] == "8"
        assert group == H200_POOL
        pods = {p.spec.node_name for p in cluster.pods(selector)}
        assert node_name in pods

        # Which replica goes on the way down is the ReplicaSet controller's choice; the pod deletion cost
        # (a Kubernetes annotation anyone may set) makes it the new one, which empties the new node for the
        # Cluster Autoscaler. (Left alone, it removes the pod ready for the shorter time, by powers of two.)
        (second,) = [p for p in cluster.pods(selector) if p.metadata.uid != first.metadata.uid]
        cluster.core.patch_namespaced_pod(
            second.metadata.name,
            cluster.namespace,
            {"metadata": {"annotations": {"controller.kubernetes.io/pod-deletion-cost": "-100"}}},
        )
        scale(cluster, name, 1)
        wait_for(
            lambda: replicas(cluster, name) == 1 and len(cluster.pods(selector)) == 1,
            timeout=90,
            what="scale-down to one replica",
        )
        wait_for(
            lambda: node_name not in gpu_node_groups(cluster.core),
            timeout=120,
            what=f"the Cluster Autoscaler to remove {node_name}",
        )
    assert cluster.wait_phase(name, "Ready", timeout=60, since_generation=False)["readyReplicas"] == 1
    # Never a node of another pool (say H100) for this deployment.
    products = {
        cluster.core.read_node(n).metadata.labels["nvidia.com/gpu.product"]
        for n in gpu_node_groups(cluster.core)
        if n not in before
    }
    assert products <= {H200}, products
