"""Errors of backend selection, and the one place ``tensorrt_llm`` is imported from."""

from __future__ import annotations

import importlib
from types import ModuleType


class BackendUnavailableError(RuntimeError):
    """The chosen backend cannot run here (its library is missing, or it does not support the method)."""


def import_tensorrt_llm(module: str, backend: str) -> ModuleType:
    """Import ``module`` (``tensorrt_llm`` or one of its submodules) or fail with one clear message.

    Lazy on purpose: the server, its other backends and its tests run without TensorRT-LLM installed.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"backend {backend} needs TensorRT-LLM, and importing {module} failed ({exc}). "
            "Run the specdeploy server image (Dockerfile.server), which pins a TensorRT-LLM release, "
            "or use --backend pytorch-reference with a Hugging Face checkpoint."
        ) from exc
