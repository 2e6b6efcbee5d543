"""Checkpoints: where a model comes from and how it is quantized. Shared by SpeculativeDeployment and
EngineBuild."""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, StringConstraints
from pydantic_core import PydanticCustomError

from .base import ApiModel
from .meta import DnsSubdomain

__all__ = ["MODEL_URI_PATTERN", "ModelSource", "ModelUri", "QuantizationSpec"]

MODEL_URI_PATTERN = (
    r"^(hf://[A-Za-z0-9][-A-Za-z0-9_.]*/[A-Za-z0-9][-A-Za-z0-9_.]*"
    r"|s3://[a-z0-9][-a-z0-9.]{1,61}[a-z0-9](/\S*)?"
    r"|gs://[a-z0-9][-a-z0-9_.]{1,220}[a-z0-9](/\S*)?"
    r"|pvc://[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?(/\S*)?)$"
)
_MODEL_URI_RE = re.compile(MODEL_URI_PATTERN)


def _check_model_uri(uri: str) -> str:
    if not _MODEL_URI_RE.fullmatch(uri):
        raise PydanticCustomError(
            "model_uri",
            "must be hf://org/name, s3://bucket/prefix, gs://bucket/prefix or pvc://claim/path",
        )
    return uri


ModelUri = Annotated[
    str,
    Field(min_length=1, max_length=1024, json_schema_extra={"pattern": MODEL_URI_PATTERN}),
    AfterValidator(_check_model_uri),
]


class ModelSource(ApiModel):
    """Where a checkpoint comes from."""

    uri: ModelUri
    """Checkpoint location: `hf://org/name` (Hugging Face Hub), `s3://bucket/prefix`, `gs://bucket/prefix`, or
    `pvc://claim/path` (a PersistentVolumeClaim in the same namespace)."""
    revision: Annotated[str, StringConstraints(pattern=r"^\S+$", min_length=1, max_length=256)] | None = None
    """Branch, tag or commit of an `hf://` repository (default: the repository's default branch). Pin a commit
    for reproducible engines."""
    credentials_secret: DnsSubdomain | None = None
    """Name of a Secret in the same namespace holding the token for the source (for example `HF_TOKEN` for
    `hf://`). Only the download step sees it; it is never copied into status, events or logs."""


class QuantizationSpec(ApiModel):
    """How the checkpoint is converted before the engine build (TensorRT-LLM `quantize.py`)."""

    format: Literal["none", "fp8", "int8_sq", "int4_awq", "w4a8_awq", "nvfp4"] = "none"
    """Weight quantization (`--qformat`): `none` keeps the checkpoint's precision."""
    kv_cache_dtype: Literal["auto", "fp8", "int8"] = "auto"
    """KV cache precision (`--kv_cache_dtype`); `auto` keeps the model's dtype."""
    calib_size: Annotated[int, Field(ge=1, le=65536)] = 512
    """Number of calibration samples (`--calib_size`) for formats that calibrate."""
    dtype: Literal["auto", "float16", "bfloat16"] = "auto"
    """Compute dtype of the non-quantized parts (`--dtype`); `auto` takes it from the checkpoint."""
