"""The local cluster's address plan: nodes and the apiserver's node connections stay on loopback, pods in the
pod network this machine keeps to itself (specdeploy_localcluster.podnet).

Regression for the apiserver connecting to `10.250.0.1:10250` (a simulated node's old InternalIP and default
kubelet port) on `kubectl logs`: such a request must land on kwok's kubelet-API server on 127.0.0.1, and the
session's loopback-only guard (tests/conftest.py, specdeploy_localcluster.netguard) must have seen nothing
else.
"""

from __future__ import annotations

import ipaddress
import json

import pytest
from kubernetes import client
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.netguard import NetGuard
from specdeploy_localcluster.podnet import POD_NETWORK

from tests.conftest import Kubectl, wait_for


def _loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def test_every_node_has_a_loopback_address_a_kubelet_port_on_kwok_and_a_pod_cidr_kept_on_this_machine(
    core: client.CoreV1Api, local_cluster: LocalCluster | None
) -> None:
    if local_cluster is None:
        pytest.skip("the address plan is the local cluster's (USE_EXISTING_CLUSTER=1 uses another cluster)")
    kwok_port = local_cluster.state()["ports"]["kwok"]

    def nodes_with_cidrs() -> list[client.V1Node]:
        nodes = core.list_node().items
        return nodes if nodes and all(n.spec.pod_cidr for n in nodes) else []

    nodes = wait_for(nodes_with_cidrs, timeout=60, what="a podCIDR on every node (node IPAM)")
    for node in nodes:
        name = node.metadata.name
        addresses = [a.address for a in node.status.addresses if a.type in ("InternalIP", "ExternalIP")]
        assert addresses, f"{name} reports no address"
        assert all(_loopback(a) for a in addresses), f"{name}: {addresses}"
        assert node.status.daemon_endpoints.kubelet_endpoint.port == kwok_port, name
        assert ipaddress.IPv4Network(node.spec.pod_cidr).subnet_of(POD_NETWORK), name


def test_kubectl_logs_of_a_simulated_pod_reaches_kwok_and_nothing_off_this_machine(
    kubectl: Kubectl, namespace: str, core: client.CoreV1Api, net_guard: NetGuard
) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "simulated", "namespace": namespace},
        "spec": {
            "containers": [{"name": "main", "image": "registry.invalid/simulated:1"}],
            "nodeSelector": {"specdeploy.dev/node-pool": "cpu"},
        },
    }
    kubectl("apply", "-f", "-", input=json.dumps(pod))

    def running() -> client.V1Pod | None:
        live = core.read_namespaced_pod("simulated", namespace)
        return live if live.status.phase == "Running" and live.status.pod_ip else None

    live = wait_for(running, timeout=60, what="the simulated pod to run")
    assert ipaddress.IPv4Address(live.status.pod_ip) in POD_NETWORK, live.status.pod_ip
    assert _loopback(live.status.host_ip), live.status.host_ip
    # kwok has no Logs rule for this pod, so it answers with an error of its own; what matters is who
    # answered: kwok on loopback, not a dial to an address elsewhere (which would time out or hang).
    result = kubectl("logs", "-n", namespace, "simulated", "--request-timeout=20s", check=False)
    assert "10.250.0.1" not in result.stderr, result.stderr
    assert "dial tcp" not in result.stderr, result.stderr
    net_guard.sample()
    assert net_guard.violations == []
