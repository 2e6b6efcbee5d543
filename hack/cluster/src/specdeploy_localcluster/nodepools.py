"""The local cluster's node pools (pure): the `nodepools.yaml` format, and what its fake GPU nodes look like
to the scheduler (capacity, GPU labels and taints as NVIDIA's GPU operator puts them on real nodes) and to
the Cluster Autoscaler's kwok provider (node templates, node groups)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy_localcluster.paths import HARNESS_DIR

DEFAULT_NODEPOOLS = HARNESS_DIR / "nodepools.yaml"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
KWOK_ANNOTATION = ("kwok.x-k8s.io/node", "fake")
POOL_LABEL = "specdeploy.dev/node-pool"
# Nodes of an autoscaled pool carry this label (value: the pool's name); the Cluster Autoscaler's kwok
# provider groups its node templates by it (`nodegroups.fromNodeLabelKey`).
NODE_GROUP_LABEL = "specdeploy.dev/node-group"
# The kwok provider marks every node it creates with its node group's name under this annotation.
CA_NODE_GROUP_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/name"
CA_MIN_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/min-count"
CA_MAX_ANNOTATION = "cluster-autoscaler.kwok.nodegroup/max-count"
# The kwok provider's ConfigMap of node templates (it lives beside the autoscaler's other ConfigMaps).
CA_TEMPLATES_CONFIGMAP = "kwok-provider-templates"
# The default pools for replicas that span nodes (nodepools.yaml: h100-multinode, h100-multinode-autoscaled)
# carry this label ("true") and a NoSchedule taint of the same key: only pods that ask for them land there.
MULTINODE_LABEL = "specdeploy.dev/multinode"
MULTINODE_TOLERATION = {"key": MULTINODE_LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}


class NodePoolError(ValueError):
    """A node-pools file that says something impossible or unknown; the message names the pool and field."""


@dataclass(frozen=True)
class GpuSpec:
    product: str
    count: int
    memory_mib: int | None = None
    resource: str = "nvidia.com/gpu"


@dataclass(frozen=True)
class NodePool:
    name: str
    nodes: int
    instance_type: str
    cpu: str = "32"
    memory: str = "128Gi"
    pods: int = 110
    gpu: GpuSpec | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] | None = None  # None: the default for the pool's kind

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> NodePool:
        known = {"name", "nodes", "instanceType", "cpu", "memory", "pods", "gpu", "labels", "taints"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise NodePoolError(f"node pool {raw.get('name', '?')!r}: unknown field(s) {', '.join(unknown)}")
        for key in ("name", "nodes", "instanceType"):
            if key not in raw:
                raise NodePoolError(f"node pool {raw.get('name', '?')!r}: field {key!r} is required")
        if not isinstance(raw["nodes"], int) or raw["nodes"] < 0:
            raise NodePoolError(f"node pool {raw['name']!r}: nodes must be a non-negative integer")
        gpu = None
        if raw.get("gpu") is not None:
            g = raw["gpu"]
            if not isinstance(g.get("count"), int) or g["count"] <= 0 or not g.get("product"):
                raise NodePoolError(f"node pool {raw['name']!r}: gpu needs a product and a positive count")
            gpu = GpuSpec(
                product=str(g["product"]),
                count=int(g["count"]),
                memory_mib=g.get("memoryMiB"),
                resource=str(g.get("resource", "nvidia.com/gpu")),
            )
        taints = raw.get("taints")
        return NodePool(
            name=str(raw["name"]),
            nodes=int(raw["nodes"]),
            instance_type=str(raw["instanceType"]),
            cpu=str(raw.get("cpu", "32")),
            memory=str(raw.get("memory", "128Gi")),
            pods=int(raw.get("pods", 110)),
            gpu=gpu,
            labels={str(k): str(v) for k, v in (raw.get("labels") or {}).items()},
            taints=None if taints is None else tuple(dict(t) for t in taints),
        )


@dataclass(frozen=True)
class AutoscaledPool:
    """A node pool that starts with `min_nodes` nodes and that the Cluster Autoscaler grows up to `max_nodes`
    (and shrinks back) with nodes made from its template."""

    pool: NodePool
    min_nodes: int
    max_nodes: int

    @property
    def name(self) -> str:
        return self.pool.name

    @staticmethod
    def from_dict(raw: Mapping[str, Any]) -> AutoscaledPool:
        name = raw.get("name", "?")
        for key in ("minNodes", "maxNodes"):
            if key not in raw:
                raise NodePoolError(f"autoscaled pool {name!r}: field {key!r} is required")
            if not isinstance(raw[key], int) or raw[key] < 0:
                raise NodePoolError(f"autoscaled pool {name!r}: {key} must be a non-negative integer")
        if "nodes" in raw:
            raise NodePoolError(f"autoscaled pool {name!r}: use minNodes/maxNodes, not nodes")
        if raw["maxNodes"] < raw["minNodes"] or raw["maxNodes"] == 0:
            raise NodePoolError(f"autoscaled pool {name!r}: need 0 <= minNodes <= maxNodes and maxNodes > 0")
        rest = {k: v for k, v in raw.items() if k not in ("minNodes", "maxNodes")}
        pool = NodePool.from_dict({**rest, "nodes": 0})
        return AutoscaledPool(pool=pool, min_nodes=int(raw["minNodes"]), max_nodes=int(raw["maxNodes"]))


def _load_pools_doc(path: Path) -> dict[str, Any]:
    import yaml  # noqa: PLC0415 - `down` and `status` run without PyYAML

    doc = yaml.safe_load(path.read_text()) or {}
    names = [p.get("name") for p in doc.get("pools") or []]
    names += [p.get("name") for p in doc.get("autoscaledPools") or []]
    if len(set(names)) != len(names):
        raise NodePoolError(
            f"{path}: node pool names must be unique (pools and autoscaledPools), got {names}"
        )
    return dict(doc)


def load_nodepools(path: Path) -> list[NodePool]:
    """The static pools (`pools:`): their nodes exist from the start and are never removed."""
    return [NodePool.from_dict(p) for p in _load_pools_doc(path).get("pools") or []]


def load_autoscaled_pools(path: Path) -> list[AutoscaledPool]:
    """The pools the Cluster Autoscaler manages (`autoscaledPools:`)."""
    return [AutoscaledPool.from_dict(p) for p in _load_pools_doc(path).get("autoscaledPools") or []]


def _node_manifest(pool: NodePool, name: str) -> dict[str, Any]:
    labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": pool.instance_type,
        POOL_LABEL: pool.name,
        "type": "kwok",
    }
    capacity = {"cpu": pool.cpu, "memory": pool.memory, "pods": str(pool.pods)}
    taints: list[Mapping[str, str]] = []
    if pool.gpu is not None:
        labels["nvidia.com/gpu.product"] = pool.gpu.product
        labels["nvidia.com/gpu.count"] = str(pool.gpu.count)
        labels["nvidia.com/gpu.present"] = "true"
        if pool.gpu.memory_mib is not None:
            labels["nvidia.com/gpu.memory"] = str(pool.gpu.memory_mib)
        capacity[pool.gpu.resource] = str(pool.gpu.count)
        taints = [GPU_TAINT]
    if pool.taints is not None:
        taints = list(pool.taints)
    labels.update(pool.labels)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": labels,
            "annotations": {KWOK_ANNOTATION[0]: KWOK_ANNOTATION[1]},
        },
        "spec": {"taints": [dict(t) for t in taints]} if taints else {},
        "status": {"capacity": dict(capacity), "allocatable": dict(capacity)},
    }


def node_manifests(pools: Iterable[NodePool]) -> list[dict[str, Any]]:
    """The Node objects for the pools: capacity, GPU labels and taints as real GPU nodes carry them."""
    return [_node_manifest(pool, f"{pool.name}-{index}") for pool in pools for index in range(pool.nodes)]


def node_templates(pools: Iterable[AutoscaledPool]) -> list[dict[str, Any]]:
    """The Cluster Autoscaler's node templates (kwok provider), one per autoscaled pool: the same labels,
    capacity and taints as a static node of the same shape, plus the node-group label and the group's
    min/max annotations. The kwok provider copies a template's labels verbatim onto every node it makes,
    so the template has no `kubernetes.io/hostname`: a kwok Stage (stages/nodes.yaml) sets it to the node's
    name, as a kubelet would."""
    templates = []
    for autoscaled in pools:
        node = _node_manifest(autoscaled.pool, autoscaled.name)
        del node["metadata"]["labels"]["kubernetes.io/hostname"]
        node["metadata"]["labels"][NODE_GROUP_LABEL] = autoscaled.name
        node["metadata"]["annotations"].update(
            {CA_MIN_ANNOTATION: str(autoscaled.min_nodes), CA_MAX_ANNOTATION: str(autoscaled.max_nodes)}
        )
        templates.append(node)
    return templates


def kwok_provider_config(pools: Iterable[AutoscaledPool]) -> dict[str, Any]:
    """The kwok cloud provider's configuration (ConfigMap `kwok-provider-config`, key `config`): node groups
    from the templates ConfigMap, grouped by NODE_GROUP_LABEL, without the provider's own taint (our GPU
    taint stays), GPU types known by their product label."""
    products = sorted({p.pool.gpu.product for p in pools if p.pool.gpu is not None})
    nodes: dict[str, Any] = {"skipTaint": True}
    if products:
        nodes["gpuConfig"] = {
            "gpuLabelKey": "nvidia.com/gpu.product",
            "availableGPUTypes": {product: {} for product in products},
        }
    return {
        "apiVersion": "v1alpha1",
        "readNodesFrom": "configmap",
        "nodegroups": {"fromNodeLabelKey": NODE_GROUP_LABEL},
        "nodes": nodes,
        "configmap": {"name": CA_TEMPLATES_CONFIGMAP},
    }
