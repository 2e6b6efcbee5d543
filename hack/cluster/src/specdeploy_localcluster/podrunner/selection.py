"""Which pods the pod runner runs for real, and the kwok Stage selector that leaves exactly those to it.

A pod is *runnable* when every container (init containers included) uses an image the runner can provide —
the project's server image, whose programs are this checkout's virtualenv — and none asks for a GPU (any
`nvidia.com/*` resource): serving pods of `backend: transformers` on CPU and the build/stage pods of such
deployments. Every other pod (TensorRT-LLM backends, GPU pods, images we cannot run) stays simulated by kwok.

The same rule exists twice, once here (Python, for the runner) and once as a jq expression (for kwok's Stage
selectors, which must skip runnable pods before they are scheduled); `kwok_skip_expression` renders the second
from the same inputs, and the integration tests check that the two agree on real pods.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = [
    "DEFAULT_IMAGES",
    "GPU_RESOURCE_PREFIX",
    "KWOK_CRDS",
    "ImageDefaults",
    "is_runnable",
    "kwok_skip_expression",
]

GPU_RESOURCE_PREFIX: Final = "nvidia.com/"
KWOK_CRDS: Final = ("Logs", "Exec", "PortForward")
"""The kinds kwok serves from CRDs for the runner's pods (`kwok --enable-crds`; podrunner/kwokobjects.py)."""


class ImageDefaults:
    """What an image would bring: its ENTRYPOINT/CMD (used when a container sets no `command`/`args`), its
    USER as (uid, gid) (used when the pod names none), its ENV and its WORKDIR (used without `workingDir`)."""

    def __init__(
        self,
        entrypoint: list[str],
        cmd: list[str] | None = None,
        *,
        user: tuple[int, int] = (0, 0),
        env: Mapping[str, str] | None = None,
        workdir: str = "/",
    ) -> None:
        self.entrypoint = entrypoint
        self.cmd = cmd or []
        self.user = user
        self.env = dict(env or {})
        self.workdir = workdir


DEFAULT_IMAGES: Final[Mapping[str, ImageDefaults]] = {
    # Dockerfile.server: ENTRYPOINT ["specdeploy-server"], USER 10001:10001, ENV HOME=/tmp, WORKDIR /tmp. The
    # operator's default server and builder image.
    "ghcr.io/specdeploy/server:0.1.0": ImageDefaults(
        ["specdeploy-server"], user=(10001, 10001), env={"HOME": "/tmp"}, workdir="/tmp"
    ),
    # Dockerfile.trainer, the same but ENTRYPOINT ["specdeploy-distill"]; its ModelOpt is this checkout's (the
    # test extras pin the same version). A DraftTraining's EAGLE-3 train Job.
    "ghcr.io/specdeploy/trainer:0.1.0": ImageDefaults(
        ["specdeploy-distill"], user=(10001, 10001), env={"HOME": "/tmp"}, workdir="/tmp"
    ),
}


def _containers(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = pod.get("spec") or {}
    return [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]


def _asks_for_gpu(container: Mapping[str, Any]) -> bool:
    resources = container.get("resources") or {}
    names = {*(resources.get("requests") or {}), *(resources.get("limits") or {})}
    return any(name.startswith(GPU_RESOURCE_PREFIX) for name in names)


def is_runnable(pod: Mapping[str, Any], images: Iterable[str]) -> bool:
    """Whether the runner runs `pod` (a Pod as JSON) for real."""
    allowed = set(images)
    containers = _containers(pod)
    return bool(containers) and all(c.get("image") in allowed and not _asks_for_gpu(c) for c in containers)


def kwok_skip_expression(images: Iterable[str]) -> dict[str, Any]:
    """A kwok Stage `matchExpressions` item that matches every pod except the runnable ones (kwok's jq
    query yields `true` for a runnable pod; `NotIn ['true']` then leaves the pod alone; a query error yields
    nothing, and kwok simulates the pod as before)."""
    image_test = " or ".join(f".image == {json.dumps(image)}" for image in sorted(set(images))) or "false"
    gpu_free = (
        "([(.resources.requests // {}), (.resources.limits // {})] | add | keys"
        f" | all(startswith({json.dumps(GPU_RESOURCE_PREFIX)}) | not))"
    )
    query = (
        "[(.spec.initContainers // [])[], (.spec.containers // [])[]]"
        f" | length > 0 and all(({image_test}) and {gpu_free})"
    )
    return {"key": query, "operator": "NotIn", "values": ["true"]}
