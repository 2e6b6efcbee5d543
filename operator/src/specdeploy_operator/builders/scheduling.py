"""GPU scheduling of a pod, the one helper serving pods and build pods share: which extended resource (a
whole GPU, `nvidia.com/gpu`, or a MIG slice such as `nvidia.com/mig-3g.40gb`), how many, on which GPU product
(node label `nvidia.com/gpu.product`, set by GPU feature discovery), tolerating the GPU taint and the user's
tolerations."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

__all__ = ["DEFAULT_GPU_RESOURCE", "GPU_PRODUCT_LABEL", "GPU_TOLERATION", "GpuScheduling"]

DEFAULT_GPU_RESOURCE: Final = "nvidia.com/gpu"
GPU_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"
GPU_TOLERATION: Final = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@dataclass(frozen=True)
class GpuScheduling:
    """`count` GPUs (or MIG slices) of `resource` on a node of `product`."""

    product: str
    count: int
    resource: str = DEFAULT_GPU_RESOURCE
    tolerations: Sequence[dict[str, Any]] = field(default_factory=tuple)

    def limits(self) -> dict[str, str]:
        """The container's requests and limits (equal: extended resources cannot be overcommitted)."""
        return {self.resource: str(self.count)}

    def resources(self) -> dict[str, dict[str, str]]:
        return {"limits": self.limits(), "requests": self.limits()}

    def node_selector(self) -> dict[str, str]:
        return {GPU_PRODUCT_LABEL: self.product}

    def pod_tolerations(self) -> list[dict[str, Any]]:
        """The GPU taint's toleration, then the user's (without repeats)."""
        out: list[dict[str, Any]] = [dict(GPU_TOLERATION)]
        for toleration in self.tolerations:
            if dict(toleration) not in out:
                out.append(dict(toleration))
        return out
