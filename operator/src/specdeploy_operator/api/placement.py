"""Where a SpeculativeDeployment's pods run (`spec.placement`): device, GPU product and resource, draft
placement and pod scheduling."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from .base import ApiModel, Rule, Rules
from .meta import Affinity, DnsSubdomain, LabelValue, QualifiedName, SelectorValue, Toleration

__all__ = ["PLACEMENT_RULES", "Device", "MultiNodeSpec", "NcclSpec", "PlacementSpec"]

Device = Literal["gpu", "cpu"]


def _no_gpu_product_on_cpu(s: PlacementSpec) -> bool:
    return s.device != "cpu" or s.gpu_product is None


PLACEMENT_RULES: Rules = (
    Rule["PlacementSpec"](
        name="gpu-product-not-on-cpu",
        # `has(self.device)` guards the apiserver's check of spec.placement's `default: {}` (see rollout).
        cel="!has(self.device) || self.device != 'cpu' || !has(self.gpuProduct)",
        message="spec.placement.gpuProduct must not be set when spec.placement.device is cpu",
        field_path=".gpuProduct",
        check=_no_gpu_product_on_cpu,
        reason="FieldValueForbidden",
    ),
)


_InterfaceNames = Annotated[
    str, StringConstraints(pattern=r"^[=^]?[A-Za-z0-9_.:-]+(,[A-Za-z0-9_.:-]+)*$", max_length=128)
]


class NcclSpec(ApiModel):
    """How NCCL connects the ranks of a replica that spans nodes."""

    socket_interface: _InterfaceNames = "eth0"
    """Network interfaces NCCL's bootstrap and socket transport use (`NCCL_SOCKET_IFNAME`: a name or prefix,
    a comma-separated list, `=name` for an exact match, `^name` to exclude). `eth0` is a pod's interface on
    the cluster network; name another one where a CNI adds a faster network (e.g. Multus `net1`)."""
    infiniband: bool = True
    """Whether NCCL may use InfiniBand or RoCE between the nodes where it finds the devices (NCCL's default).
    `false` sets `NCCL_IB_DISABLE=1`: TCP sockets only, for clusters without RDMA devices in the pods."""


class MultiNodeSpec(ApiModel):
    """Settings of a replica that spans nodes: when its GPUs are more than `spec.placement.gpusPerNode`, it
    runs as a LeaderWorkerSet group of that many nodes' pods (docs/operator.md, "Replicas that span
    nodes"). Ignored while a replica fits on one node."""

    exclusive_topology: QualifiedName | None = None
    """A node label (e.g. a rack or NVLink-domain label) whose value every pod of a group shares, with one
    group per value (LeaderWorkerSet's exclusive topology). Unset: a group's pods go wherever GPUs are
    free."""
    nccl: NcclSpec = Field(default_factory=NcclSpec, json_schema_extra={"default": {}})
    """NCCL's network settings."""


class PlacementSpec(ApiModel):
    """Where the pods run and how the draft shares GPUs with the target."""

    validation_rules: ClassVar[Rules] = PLACEMENT_RULES

    device: Device = "gpu"
    """`gpu`: each replica requests `spec.placement.gpuResource` GPUs on a node of `gpuProduct`, tolerating
    the GPU taint. `cpu` (backend `transformers` only): no GPU request, GPU product label or GPU toleration;
    the server runs on the CPU cores of `spec.serving.resources`, for clusters and tests without GPUs."""
    draft: Literal["colocated", "dedicated"] = "colocated"
    """`colocated`: the draft's executors share the target's GPUs (seed 000: TP2 70B + TP2 8B run four
    executors on two GPUs). `dedicated`: the draft gets GPUs of its own (seed 001: draft on GPU 0, target on
    GPU 1)."""
    gpu_product: LabelValue | None = None
    """GPU model to run on, matched against the node label `nvidia.com/gpu.product`, e.g.
    `NVIDIA-H100-80GB-HBM3` or `NVIDIA-H200`. Engines are built for this product. Unset: the operator's
    default product with `device: gpu`; must stay unset with `device: cpu`."""
    gpu_resource: QualifiedName = "nvidia.com/gpu"
    """Extended resource name that GPUs are requested as."""
    gpus_per_node: Annotated[int, Field(ge=1, le=64)] = 8
    """GPUs per node of the target pool. A replica that needs more spans nodes, each of whose GPUs it takes
    whole: its GPUs must then be a multiple of this (backend `pytorch` only)."""
    node_selector: Annotated[dict[str, SelectorValue], Field(max_length=64)] | None = None
    """Extra node labels the pods require, added to the GPU product label (with `device: gpu`)."""
    tolerations: Annotated[list[Toleration], Field(max_length=32)] | None = None
    """Tolerations added to the pods (GPU node taints, dedicated pools)."""
    affinity: Affinity | None = None
    """Extra affinity rules added to the pods."""
    priority_class_name: DnsSubdomain | None = None
    """PriorityClass of the pods."""
    multi_node: MultiNodeSpec | None = None
    """Group placement and networking of replicas that span nodes; unset: the defaults."""
