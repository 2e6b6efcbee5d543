"""Where a SpeculativeDeployment's pods run (`spec.placement`): device, GPU product and resource, draft
placement and pod scheduling."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field

from .base import ApiModel, Rule, Rules
from .meta import Affinity, DnsSubdomain, LabelValue, QualifiedName, SelectorValue, Toleration

__all__ = ["PLACEMENT_RULES", "Device", "PlacementSpec"]

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
    """GPUs per node of the target pool; a replica (all its GPUs on one node) may not need more."""
    node_selector: Annotated[dict[str, SelectorValue], Field(max_length=64)] | None = None
    """Extra node labels the pods require, added to the GPU product label (with `device: gpu`)."""
    tolerations: Annotated[list[Toleration], Field(max_length=32)] | None = None
    """Tolerations added to the pods (GPU node taints, dedicated pools)."""
    affinity: Affinity | None = None
    """Extra affinity rules added to the pods."""
    priority_class_name: DnsSubdomain | None = None
    """PriorityClass of the pods."""
