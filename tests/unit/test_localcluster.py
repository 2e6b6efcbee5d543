"""The local cluster's node-pool rendering (pure): what fake GPU nodes look like to the scheduler; and its
command line's `down` and `status`, which need nothing but the standard library."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from specdeploy_localcluster.cluster import autoscaling_from_env
from specdeploy_localcluster.nodepools import (
    CA_MAX_ANNOTATION,
    CA_MIN_ANNOTATION,
    DEFAULT_NODEPOOLS,
    GPU_TAINT,
    KWOK_ANNOTATION,
    MULTINODE_LABEL,
    MULTINODE_TOLERATION,
    NODE_GROUP_LABEL,
    AutoscaledPool,
    NodePool,
    NodePoolError,
    kwok_provider_config,
    load_autoscaled_pools,
    load_nodepools,
    node_manifests,
    node_templates,
)


def test_default_pools_are_two_h100_nodes_one_h200_node_one_mig_node_a_cpu_node_and_two_multinode_nodes() -> (
    None
):
    nodes = node_manifests(load_nodepools(DEFAULT_NODEPOOLS))
    by_name = {n["metadata"]["name"]: n for n in nodes}
    assert sorted(by_name) == [
        "cpu-0",
        "h100-0",
        "h100-1",
        "h100-mig-0",
        "h100-multinode-0",
        "h100-multinode-1",
        "h200-0",
    ]
    mig = by_name["h100-mig-0"]
    assert mig["status"]["capacity"]["nvidia.com/mig-3g.40gb"] == "16"
    assert "nvidia.com/gpu" not in mig["status"]["capacity"]
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
    assert MULTINODE_LABEL not in h100["metadata"]["labels"]
    for name in ("h100-multinode-0", "h100-multinode-1"):
        multinode = by_name[name]
        assert multinode["metadata"]["labels"][MULTINODE_LABEL] == "true"
        assert multinode["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
        assert multinode["status"]["capacity"]["nvidia.com/gpu"] == "8"
        assert multinode["spec"]["taints"] == [
            GPU_TAINT,
            {k: v for k, v in MULTINODE_TOLERATION.items() if k != "operator"},
        ]


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
    with pytest.raises(NodePoolError, match=message.replace("(", r"\(").replace(")", r"\)")):
        NodePool.from_dict(raw)


def test_duplicate_pool_names_are_refused(tmp_path: Path) -> None:
    f = tmp_path / "pools.yaml"
    f.write_text("pools:\n- {name: a, nodes: 1, instanceType: x}\n- {name: a, nodes: 2, instanceType: y}\n")
    with pytest.raises(NodePoolError, match="unique"):
        load_nodepools(f)


def test_default_autoscaled_pools_are_h100_up_to_four_h200_up_to_two_and_small_cpu_nodes_up_to_two() -> None:
    pools = {p.name: p for p in load_autoscaled_pools(DEFAULT_NODEPOOLS)}
    assert sorted(pools) == [
        "cpu-autoscaled",
        "h100-autoscaled",
        "h100-multinode-autoscaled",
        "h200-autoscaled",
    ]
    assert (pools["cpu-autoscaled"].min_nodes, pools["cpu-autoscaled"].max_nodes) == (0, 2)
    assert pools["cpu-autoscaled"].pool.gpu is None
    assert (pools["h100-autoscaled"].min_nodes, pools["h100-autoscaled"].max_nodes) == (0, 4)
    assert (pools["h200-autoscaled"].min_nodes, pools["h200-autoscaled"].max_nodes) == (0, 2)
    multinode = pools["h100-multinode-autoscaled"]
    assert (multinode.min_nodes, multinode.max_nodes) == (0, 4)
    assert multinode.pool.labels == {MULTINODE_LABEL: "true"}
    # The static pools are what they were: autoscaled pools add no node at start.
    assert [p.name for p in load_nodepools(DEFAULT_NODEPOOLS)] == [
        "h100",
        "h200",
        "h100-mig",
        "cpu",
        "h100-multinode",
    ]


def test_node_templates_look_like_static_nodes_of_the_same_product_plus_group_label_and_bounds() -> None:
    static = {n["metadata"]["name"]: n for n in node_manifests(load_nodepools(DEFAULT_NODEPOOLS))}
    templates = {t["metadata"]["name"]: t for t in node_templates(load_autoscaled_pools(DEFAULT_NODEPOOLS))}
    for group, twin in (("h100-autoscaled", "h100-0"), ("h200-autoscaled", "h200-0")):
        template, node = templates[group], static[twin]
        labels = dict(template["metadata"]["labels"])
        assert labels.pop(NODE_GROUP_LABEL) == group
        assert labels.pop("specdeploy.dev/node-pool") == group
        expected = {k: v for k, v in node["metadata"]["labels"].items() if k != "kubernetes.io/hostname"}
        expected.pop("specdeploy.dev/node-pool")
        assert labels == expected  # product, count, memory, instance type, ...; no shared hostname label
        assert template["spec"] == node["spec"] == {"taints": [GPU_TAINT]}
        assert template["status"] == node["status"]
        annotations = template["metadata"]["annotations"]
        assert annotations[KWOK_ANNOTATION[0]] == KWOK_ANNOTATION[1]
    assert templates["h100-autoscaled"]["metadata"]["annotations"][CA_MAX_ANNOTATION] == "4"
    assert templates["h200-autoscaled"]["metadata"]["annotations"][CA_MIN_ANNOTATION] == "0"


def test_kwok_provider_config_groups_by_label_keeps_our_taint_and_knows_the_gpu_products() -> None:
    config = kwok_provider_config(load_autoscaled_pools(DEFAULT_NODEPOOLS))
    assert config["readNodesFrom"] == "configmap"
    assert config["nodegroups"] == {"fromNodeLabelKey": NODE_GROUP_LABEL}
    assert config["nodes"]["skipTaint"] is True
    assert config["nodes"]["gpuConfig"] == {
        "gpuLabelKey": "nvidia.com/gpu.product",
        "availableGPUTypes": {"NVIDIA-H100-80GB-HBM3": {}, "NVIDIA-H200": {}},
    }


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"name": "a", "instanceType": "x", "maxNodes": 2}, "'minNodes' is required"),
        ({"name": "a", "instanceType": "x", "minNodes": 3, "maxNodes": 2}, "minNodes <= maxNodes"),
        ({"name": "a", "instanceType": "x", "minNodes": 0, "maxNodes": 2, "nodes": 1}, "not nodes"),
        ({"name": "a", "instanceType": "x", "minNodes": 0, "maxNodes": 2, "gpus": 8}, "unknown field"),
    ],
)
def test_bad_autoscaled_pool_is_refused_with_the_field_named(raw: dict[str, object], message: str) -> None:
    with pytest.raises(NodePoolError, match=message):
        AutoscaledPool.from_dict(raw)


def test_pool_names_are_unique_across_static_and_autoscaled_pools(tmp_path: Path) -> None:
    f = tmp_path / "pools.yaml"
    f.write_text(
        "pools:\n- {name: a, nodes: 1, instanceType: x}\n"
        "autoscaledPools:\n- {name: a, minNodes: 0, maxNodes: 1, instanceType: y}\n"
    )
    with pytest.raises(NodePoolError, match="unique"):
        load_autoscaled_pools(f)


@pytest.mark.parametrize(("value", "on"), [(None, True), ("1", True), ("0", False), ("off", False)])
def test_autoscaling_is_on_unless_the_environment_turns_it_off(
    monkeypatch: pytest.MonkeyPatch, value: str | None, on: bool
) -> None:
    if value is None:
        monkeypatch.delenv("SPECDEPLOY_AUTOSCALING", raising=False)
    else:
        monkeypatch.setenv("SPECDEPLOY_AUTOSCALING", value)
    assert autoscaling_from_env() is on


HARNESS_SOURCES = Path(__file__).resolve().parents[2] / "hack" / "cluster" / "src"


@pytest.mark.parametrize(("command", "code"), [("status", 1), ("down", 0)])
def test_down_and_status_run_with_the_standard_library_only(tmp_path: Path, command: str, code: int) -> None:
    """`make cluster-down` falls back to the system Python when the virtualenv is gone: no site-packages
    (`-S`), no PYTHONPATH (`-E`)."""
    proc = subprocess.run(
        [
            sys.executable,
            "-S",
            "-E",
            "-m",
            "specdeploy_localcluster",
            command,
            "--dir",
            str(tmp_path / "cluster"),
        ],
        cwd=HARNESS_SOURCES,  # what `python -m` imports from when nothing else is on its path
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    if command == "status":
        assert proc.stdout.split()[:2] == ["etcd", "stopped"], proc.stdout
