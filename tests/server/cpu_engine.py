"""The reference backend on the tiny models for the load and draining tests, and the load gauges of its
/metrics page."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families
from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.engine import Engine

MODEL = "tiny"
PROMPT = "speculative decoding draft target model"


def cpu_engine(
    target: Path, draft: Path | None, max_batch_size: int = 64, method: str | None = None
) -> Engine:
    spec: dict[str, Any] = {"draftLen": 4}
    if method is not None:
        spec["method"] = method
    config = ServerConfig.model_validate(
        {
            "model": {
                "target": str(target),
                "draft": str(draft) if draft else None,
                "servedModelName": MODEL,
            },
            "placement": {"device": "cpu"},
            "speculative": spec,
            "runtime": {"maxBatchSize": max_batch_size},
        }
    )
    engine = build_engine(config)
    assert isinstance(engine, Engine)
    return engine


@dataclass
class Load:
    depth: float
    seconds: float
    rate: float
    in_flight: float


def load_gauges(metrics_text: str) -> Load:
    """The load gauges of a /metrics page, parsed with prometheus_client's own parser."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.labels.get("model") == MODEL:
                values[sample.name] = sample.value
    return Load(
        values["specdeploy_queue_depth"],
        values["specdeploy_queue_seconds"],
        values["specdeploy_generation_tokens_per_second"],
        values["specdeploy_requests_in_flight"],
    )
