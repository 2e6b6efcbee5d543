"""The autoscaling chain a user's cluster runs, with no value written by the test: a load generator sends real
requests to a `backend: transformers` deployment whose pods run the real server → the servers' queue gauges
rise → Prometheus scrapes them (configured from the chart's PodMonitor) → prometheus-adapter serves them under
custom.metrics.k8s.io (the chart's rules) → the operator's HPA raises replicas → the replica that does not
fit is `CapacityPending` → the Cluster Autoscaler adds a node of the right pool (`cpu-autoscaled`, small CPU
nodes that hold one replica each) → the new replica runs the real server and takes traffic → load stops →
scale down, node removed. On the way: `status.speculation` and `kubectl get sdep` show the acceptance the
servers measured.

GPU pools take the same path from the HPA on, with simulated pods (no real server can run there):
test_autoscaling.py raises replicas through the scale subresource as an HPA does and checks the GPU node.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.demomodels import make_demo_models
from specdeploy_localcluster.nodepools import NODE_GROUP_LABEL, POOL_LABEL
from specdeploy_localcluster.serviceload import StreamingLoad

from tests.conftest import OPERATOR_NAMESPACE_PREFIX, Kubectl, fresh_namespace, wait_for
from tests.integration.test_real_pods import GROUP, TRAINING_STEPS, VERSION, Served

pytestmark = pytest.mark.usefixtures("operator")

POOL = "cpu-autoscaled"
METRIC = "specdeploy_queue_depth"
TARGET = 2  # requests waiting or running per replica; 8 streaming clients keep one replica at ~8
CLIENTS = 8
LOW_ACCEPTANCE = 0.2  # the operator's default SPECDEPLOY_LOW_ACCEPTANCE_RATE


@pytest.fixture
def served(
    kubectl: Kubectl, api_client: client.ApiClient, autoscaling_cluster: LocalCluster
) -> Iterator[Served]:
    with fresh_namespace(client.CoreV1Api(api_client), OPERATOR_NAMESPACE_PREFIX) as namespace:
        make_demo_models(kubectl, namespace, TRAINING_STEPS)
        yield Served(kubectl, api_client, namespace)


def pool_nodes(core: client.CoreV1Api) -> list[client.V1Node]:
    return list(core.list_node(label_selector=f"{NODE_GROUP_LABEL}={POOL}").items)


def pod_metric(s: Served, pod: str) -> float | None:
    """The pod's `METRIC` as the custom metrics API serves it (what the HPA controller reads), or None."""
    path = f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{s.namespace}/pods/{pod}/{METRIC}"
    got = s.kubectl("get", "--raw", path, check=False)
    if got.returncode != 0:
        assert "NotFound" in got.stderr or "not found" in got.stderr, got.stderr
        return None
    items = json.loads(got.stdout).get("items") or []
    return parse_quantity(items[0]["value"]) if items else None


def replicas(s: Served) -> int:
    """`spec.replicas` of the deployment: what its HPA writes through the scale subresource."""
    obj = s.custom.get_namespaced_custom_object(GROUP, VERSION, s.namespace, "speculativedeployments", s.name)
    return int(obj["spec"]["replicas"])


def parse_quantity(value: str) -> float:
    return float(value[:-1]) / 1000 if value.endswith("m") else float(value)


def operator_reasons(core: client.CoreV1Api, namespace: str) -> set[str]:
    events = core.list_namespaced_event(namespace).items
    return {e.reason for e in events if e.source and e.source.component == "specdeploy-operator"}


def test_real_load_scales_out_through_prometheus_and_the_adapter_onto_a_new_node_and_back(
    served: Served, autoscaling_cluster: LocalCluster
) -> None:
    s, core = served, served.core
    s.apply(
        {
            "placement": {"device": "cpu", "nodeSelector": {POOL_LABEL: POOL}},
            "serving": {
                "resources": {
                    "requests": {"cpu": "600m", "memory": "512Mi"},  # one replica per 1-CPU node of the pool
                    "limits": {"cpu": "1", "memory": "1536Mi"},
                }
            },
            "autoscaling": {
                "minReplicas": 1,
                "maxReplicas": 2,
                "metric": "queueDepth",
                "target": TARGET,
                "scaleUp": {"stabilizationWindowSeconds": 0, "periodSeconds": 5},
                "scaleDown": {"stabilizationWindowSeconds": 15, "periodSeconds": 5},
            },
        }
    )
    # The first replica already needs a node of the pool (it starts empty).
    s.wait_ready(timeout=300)
    [first] = s.pods()
    assert first.status.container_statuses[0].container_id.startswith("podrunner://")
    assert [n.metadata.name for n in pool_nodes(core)] == [first.spec.node_name]

    # Idle: Prometheus found the pod through the API and scrapes it; the adapter serves its queue depth, 0.
    def scraped() -> list[dict[str, Any]] | None:
        targets = [
            t
            for t in autoscaling_cluster.prometheus_targets()
            if t["labels"].get("pod") == first.metadata.name and t["health"] == "up"
        ]
        return targets or None

    [target] = wait_for(scraped, timeout=60, interval=1, what="Prometheus scraping the serving pod")
    assert target["labels"]["namespace"] == s.namespace
    assert target["scrapeUrl"] == f"http://{first.status.pod_ip}:8000/metrics"
    idle = wait_for(
        lambda: pod_metric(s, first.metadata.name) is not None or None,
        timeout=60,
        interval=1,
        what=f"{METRIC} of the pod in the custom metrics API",
    )
    assert idle is True
    assert pod_metric(s, first.metadata.name) == 0

    load = StreamingLoad(s.endpoints, clients=CLIENTS, max_tokens=48).start()
    try:
        # The servers' own gauge, through Prometheus and the adapter, crosses the target.
        wait_for(
            lambda: (pod_metric(s, first.metadata.name) or 0) > TARGET or None,
            timeout=90,
            interval=1,
            what=f"{METRIC} above {TARGET} in the custom metrics API",
        )
        hpa_raised = wait_for(
            lambda: replicas(s) == 2 or None,
            timeout=90,
            interval=0.5,
            what="the HPA raising replicas to 2",
        )
        assert hpa_raised is True
        # The second replica fits no node: CapacityPending, then a second node of the pool.
        wait_for(
            lambda: "CapacityPending" in operator_reasons(core, s.namespace) or None,
            timeout=60,
            interval=0.5,
            what="CapacityPending for the replica that does not fit",
        )
        wait_for(lambda: len(pool_nodes(core)) == 2 or None, timeout=90, interval=1, what="a second node")
        status = s.wait_ready(timeout=240)
        assert status["readyReplicas"] == 2
        pods = {p.metadata.name: p for p in s.pods()}
        [second] = [p for name, p in pods.items() if name != first.metadata.name]
        assert second.spec.node_name != first.spec.node_name
        assert second.spec.node_name in {n.metadata.name for n in pool_nodes(core)}
        assert second.status.container_statuses[0].container_id.startswith("podrunner://")
        # The new replica takes traffic: requests complete through its endpoint.
        second_url = f"http://{second.status.pod_ip}:8000"
        wait_for(
            lambda: second_url in load.report.endpoints or None,
            timeout=60,
            interval=0.5,
            what="requests served by the new replica",
        )
        # At maxReplicas the HPA says it is limited, however high the load.
        hpa = client.AutoscalingV2Api(s.api).read_namespaced_horizontal_pod_autoscaler(s.name, s.namespace)
        limited = {c.type: (c.status, c.reason) for c in hpa.status.conditions}["ScalingLimited"]
        assert limited == ("True", "TooManyReplicas")
        # status.speculation: the servers' own acceptance counters, rolled up by the operator over its window.
        figures = wait_for(
            lambda: (s.status().get("speculation") or {}).get("pods") == 2 and s.status()["speculation"],
            timeout=60,
            interval=1,
            what="status.speculation over both replicas",
        )
        assert 0 < figures["acceptanceRate"] <= 1
        assert figures["draftLength"] > 0
        assert figures["tokensPerStep"] >= 1
        assert figures["tokensPerSecond"] > 0
        assert figures["podsSkipped"] == 0

        # The operator rewrites the figures every window: the column is compared with a status read just
        # before and one just after it, until one of them is the figures it printed.
        def column_is_status() -> list[str] | None:
            before = s.status()["speculation"]["acceptanceRate"]
            shown: list[str] = s.kubectl("get", "sdep", s.name, "-n", s.namespace).stdout.splitlines()
            after = s.status()["speculation"]["acceptanceRate"]
            return shown if float(shown[1].split()[6]) in (before, after) else None

        shown = wait_for(
            column_is_status, timeout=30, what="kubectl get's ACCEPTANCE equal to status.speculation"
        )
        assert shown[0].split()[6:8] == ["ACCEPTANCE", "TOKENS/STEP"], shown
        # The verdict follows the acceptance it names: that of the last window drafting enough to judge by,
        # often the published one (these briefly trained demo models may well fall under 20 %).
        effective = next(c for c in s.status()["conditions"] if c["type"] == "SpeculationEffective")
        judged = int(re.findall(r"(\d+)%", effective["message"])[0]) / 100
        if judged < LOW_ACCEPTANCE - 0.005:
            assert (effective["status"], effective["reason"]) == ("False", "LowAcceptance")
            wait_for(
                lambda: "LowAcceptance" in operator_reasons(core, s.namespace),
                timeout=30,
                what="the LowAcceptance event",
            )
        elif judged > LOW_ACCEPTANCE + 0.005:  # (a rate within half a percent of it prints as 20 %)
            assert (effective["status"], effective["reason"]) == ("True", "AcceptanceHealthy")
    finally:
        report = load.stop()
    assert report.failed == [], report.failed[:3]
    assert report.truncated == [], report.truncated[:3]
    assert report.completed > 0

    # No load: the gauges fall to 0, the HPA scales in, the Cluster Autoscaler removes the emptied node.
    wait_for(
        lambda: replicas(s) == 1 or None,
        timeout=120,
        interval=1,
        what="the HPA scaling back to 1",
    )
    s.wait_ready(timeout=120)
    # A manual scale while the HPA exists is overridden at its next sync (no load: back to minReplicas).
    s.kubectl("scale", f"sdep/{s.name}", "-n", s.namespace, "--replicas=2")
    wait_for(lambda: replicas(s) == 1 or None, timeout=60, interval=0.5, what="the HPA undoing kubectl scale")
    wait_for(
        lambda: len(pool_nodes(core)) == 1 or None, timeout=120, interval=1, what="the emptied node removed"
    )
