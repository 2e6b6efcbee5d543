"""The local cluster's node-pool rendering (pure): what fake GPU nodes look like to the scheduler."""

from __future__ import annotations

from pathlib import Path

import pytest
from localcluster import (
    DEFAULT_NODEPOOLS,
    GPU_TAINT,
    ClusterError,
    NodePool,
    load_nodepools,
    node_manifests,
)


def test_default_pools_are_two_h100_nodes_one_h200_node_and_a_cpu_node() -> None:
    nodes = node_manifests(load_nodepools(DEFAULT_NODEPOOLS))
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert sorted(by_name) == ["cpu-0", "h100-0", "h100-1", "h200-0"]
    h100 = by_name["h100-0"]
    assert h100["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    assert h100["metadata"]["labels"]["nvidia.com/gpu.count"] == "8"
    assert h100["metadata"]["labels"]["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert h100["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert h100["status"]["allocatable"] == h100["status"]["capacity"]
    assert h100["spec"]["taints"] == [GPU_TAINT]
    assert h100["metadata"]["annotations"] == {"kwok.x-k8s.io/node": "fake"}
    assert by_name["h200-0"]["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H200"
    cpu = by_name["cpu-0"]
    assert "nvidia.com/gpu" not in cpu["status"]["capacity"]
    assert "nvidia.com/gpu.product" not in cpu["metadata"]["labels"]
    assert cpu["spec"] == {}


def test_pool_can_override_taints_labels_and_gpu_resource() -> None:
    pool = NodePool.from_dict(
        {
            "name": "mig",
            "nodes": 1,
            "instanceType": "custom",
            "gpu": {"product": "NVIDIA-A100", "count": 7, "resource": "nvidia.com/mig-1g.10gb"},
            "labels": {"team": "research"},
            "taints": [],
        }
    )
    (node,) = node_manifests([pool])
    assert node["status"]["capacity"]["nvidia.com/mig-1g.10gb"] == "7"
    assert node["metadata"]["labels"]["team"] == "research"
    assert node["spec"] == {}


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"nodes": 1, "instanceType": "x"}, "'name' is required"),
        ({"name": "p", "nodes": -1, "instanceType": "x"}, "non-negative"),
        ({"name": "p", "nodes": 1, "instanceType": "x", "gpus": 8}, "unknown field(s) gpus"),
        ({"name": "p", "nodes": 1, "instanceType": "x", "gpu": {"count": 8}}, "gpu needs a product"),
    ],
)
def test_bad_pool_is_refused_with_the_field_named(raw: dict[str, object], message: str) -> None:
    with pytest.raises(ClusterError, match=message.replace("(", r"\(").replace(")", r"\)")):
        NodePool.from_dict(raw)


def test_duplicate_pool_names_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "pools.yaml"
    f.write_text("pools:\n- {name: a, nodes: 1, instanceType: x}\n- {name: a, nodes: 2, instanceType: y}\n")
    with pytest.raises(ClusterError, match="unique"):
        load_nodepools(f)
