"""Where things are, in the engine cache and in the pods: the one place that says so.

The build Job writes an engine (or a staged checkpoint) into the cache claim; the serving Deployment mounts
the claim and the server configuration points the server at the same paths. Those three builders (`job.py`,
`serving.py`, `serverconfig.py`) agree because they all read this module, not because each spells the same
strings. The server reads the paths from its rendered configuration (`model.target`, `model.tokenizer`), never
from a convention of its own.

Cache claim layout (mounted at `OperatorSettings.cache_mount_path`, `/cache` by default):

    engines/<hash>/                    the engine, quantized checkpoint or staged checkpoint
    engines/<hash>/tokenizer/          the tokenizer files, copied next to a built engine
    engines/<hash>/.specdeploy-complete  the completion marker: the hash, written last
    work/<hash>/model, work/<hash>/checkpoint  the build's scratch space (download, converted checkpoint)
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from typing import Final

from specdeploy_operator.api import ModelSource, SpeculativeDeployment

from .settings import OperatorSettings

__all__ = [
    "COMPLETION_MARKER",
    "CREDENTIALS_MOUNT",
    "MODELS_MOUNT",
    "SOURCE_MOUNT",
    "TOKENIZER_DIR",
    "CacheLayout",
    "PvcSource",
    "builder_image",
    "engine_dir",
    "pvc_source",
    "served_source_mount",
    "server_image",
    "verify_script",
]

COMPLETION_MARKER: Final = ".specdeploy-complete"
"""File written into the engine directory once the engine is complete; it holds the engine's hash."""
TOKENIZER_DIR: Final = "tokenizer"
"""Subdirectory of a built engine holding the tokenizer (TensorRT-LLM engines carry none)."""
CREDENTIALS_MOUNT: Final = "/var/run/secrets/specdeploy/model"
"""Where a model's credentials Secret is mounted (read-only files, never env values)."""
SOURCE_MOUNT: Final = "/model-source"
"""Where a build pod mounts a `pvc://` checkpoint's claim."""
MODELS_MOUNT: Final = "/models"
"""Where a serving pod keeps checkpoints it loads directly: downloaded into `/models/<role>`, or a claim
mounted at `/models/source-<role>`."""


def engine_dir(hash_: str) -> str:
    """Directory of an engine inside the cache claim (relative to the claim's root)."""
    return f"engines/{hash_}"


@dataclass(frozen=True, slots=True)
class CacheLayout:
    """The cache claim as one pod sees it, mounted at `mount`."""

    mount: str

    @classmethod
    def of(cls, settings: OperatorSettings) -> CacheLayout:
        return cls(settings.cache_mount_path)

    def engine(self, relative: str) -> str:
        """Absolute path of an engine directory (`EngineBuild.spec.cache.path`) in the pod."""
        return f"{self.mount}/{relative}"

    def tokenizer(self, relative: str) -> str:
        return f"{self.engine(relative)}/{TOKENIZER_DIR}"

    def marker(self, relative: str) -> str:
        return f"{self.engine(relative)}/{COMPLETION_MARKER}"

    def work(self, hash_: str) -> str:
        """The scratch directory of the build of `hash_`."""
        return f"{self.mount}/work/{hash_}"


@dataclass(frozen=True, slots=True)
class PvcSource:
    """A `pvc://<claim>/<path>` checkpoint."""

    claim: str
    path: str

    def under(self, mount: str) -> str:
        """The checkpoint's directory when its claim is mounted at `mount`."""
        return f"{mount}/{self.path}".rstrip("/")


def pvc_source(source: ModelSource) -> PvcSource | None:
    """The claim and path of a `pvc://` source; None for any other scheme."""
    scheme, _, rest = source.uri.partition("://")
    if scheme != "pvc":
        return None
    claim, _, path = rest.partition("/")
    return PvcSource(claim, path)


def verify_script(layout: CacheLayout, engines: list[tuple[str, str, str]]) -> str:
    """A shell script that exits 1, saying which, unless every engine's completion marker holds its hash:
    `engines` is (role, hash, path in the claim). The serving pod runs it before the server, so an engine the
    cache lost (a replaced claim, a cleaned directory) stops the pod with that message instead of a server
    loading half an engine."""
    checks = []
    for role, hash_, relative in engines:
        marker = shlex.quote(layout.marker(relative))
        checks.append(
            f'if [ "$(cat {marker} 2>/dev/null)" != {shlex.quote(hash_)} ]; then '
            f"echo 'the {role} engine {hash_} is incomplete in the cache: its completion marker "
            f"{layout.marker(relative)} is missing or names another build' >&2; exit 1; fi"
        )
    return "; ".join(checks)


def served_source_mount(role: str) -> str:
    """Where a serving pod mounts the claim of the `pvc://` checkpoint of `role`."""
    return f"{MODELS_MOUNT}/source-{role}"


def server_image(sdep: SpeculativeDeployment, settings: OperatorSettings) -> str:
    """The serving image: `spec.images.server`, else the operator's image for the backend (the engine
    workflow's release for `tensorrt`, the maintained one otherwise)."""
    images = sdep.spec.images
    if images is not None and images.server is not None:
        return images.server
    return settings.engine_server_image if sdep.spec.backend == "tensorrt" else settings.server_image


def builder_image(sdep: SpeculativeDeployment, settings: OperatorSettings) -> str:
    """The image that builds engines and downloads checkpoints: `spec.images.builder`, else the operator's
    builder image, else the serving image (the release that will run what it builds)."""
    images = sdep.spec.images
    if images is not None and images.builder is not None:
        return images.builder
    return settings.builder_image or server_image(sdep, settings)
