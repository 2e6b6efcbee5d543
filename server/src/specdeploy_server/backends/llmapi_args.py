"""What ``trtllm-llmapi`` hands TensorRT-LLM's LLM API: the ``LLM``'s keyword arguments (``TorchLlmArgs``
fields), the ``speculative_config`` per method, and a request's ``GuidedDecodingParams``."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from specdeploy_server.config import Method, ServerConfig
from specdeploy_server.grammar import JSON_DEFAULTS, Guide

log = logging.getLogger(__name__)

BACKEND = "trtllm-llmapi"
#: TensorRT-LLM's guided decoding backend: llguidance, as our own core (it also takes Lark grammars)
GUIDED_DECODING_BACKEND = "llguidance"


def draft_len(config: ServerConfig) -> int:
    spec = config.speculative
    if spec.draft_len == "auto":
        log.warning("draftLen auto is not available with %s: maxDraftLen %d", BACKEND, spec.max_draft_len)
        return spec.max_draft_len
    return spec.draft_len


def speculative_config(llmapi: Any, config: ServerConfig) -> Any:
    """The ``speculative_config`` for our method (None for plain decoding)."""
    method, k = config.method, draft_len(config)
    if method == Method.NONE or k == 0:
        return None
    if method == Method.DRAFT_TARGET:
        draft = str(config.model.draft)
        return llmapi.DraftTargetDecodingConfig(max_draft_len=k, speculative_model_dir=draft)
    if method == Method.PROMPT_LOOKUP:
        # Per-request pools and the oldest match: the semantics of our own promptLookup.
        return llmapi.NGramDecodingConfig(
            max_draft_len=k,
            max_matching_ngram_size=config.speculative.prompt_lookup.max_matching_ngram_size,
            is_keep_all=True,
            is_use_oldest=True,
            is_public_pool=False,
        )
    if method == Method.EAGLE3:
        # Newer releases name the class Eagle3DecodingConfig; 1.0-1.2 run EAGLE-3 via EagleDecodingConfig.
        eagle = getattr(llmapi, "Eagle3DecodingConfig", None) or llmapi.EagleDecodingConfig
        return eagle(max_draft_len=k, speculative_model_dir=str(config.model.speculative_model))
    if method == Method.MTP:
        return llmapi.MTPDecodingConfig(num_nextn_predict_layers=k)
    raise ValueError(f"speculative.method {method.value} is not supported by {BACKEND}")


def llm_arguments(llmapi: Any, config: ServerConfig, tokenizer: Path) -> dict[str, Any]:
    """Keyword arguments of ``tensorrt_llm.LLM`` (the LLM API's ``TorchLlmArgs`` fields)."""
    runtime = config.runtime
    policy = (
        llmapi.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
        if runtime.guaranteed_no_evict
        else llmapi.CapacitySchedulerPolicy.MAX_UTILIZATION
    )
    spec = speculative_config(llmapi, config)
    args: dict[str, Any] = {
        "model": str(config.model.target),
        "tokenizer": str(tokenizer),
        "tensor_parallel_size": len(config.placement.target_device_ids),
        "max_batch_size": runtime.max_batch_size,
        "max_num_tokens": runtime.max_num_tokens,
        "kv_cache_config": llmapi.KvCacheConfig(
            enable_block_reuse=runtime.enable_kv_cache_reuse,
            free_gpu_memory_fraction=runtime.kv_cache_free_gpu_mem_fraction,
        ),
        "scheduler_config": llmapi.SchedulerConfig(capacity_scheduler_policy=policy),
        "enable_chunked_prefill": runtime.enable_chunked_context,
        "speculative_config": spec,
        # TensorRT-LLM's speculative decoding examples run with the overlap scheduler off.
        "disable_overlap_scheduler": spec is not None,
        "guided_decoding_backend": GUIDED_DECODING_BACKEND,
    }
    if runtime.max_seq_len is not None:
        args["max_seq_len"] = runtime.max_seq_len
    return args


def checkpoint_field(path: Path, name: str) -> int | None:
    config_file = path / "config.json"
    if not config_file.is_file():
        return None
    value = json.loads(config_file.read_text(encoding="utf-8")).get(name)
    return int(value) if isinstance(value, int) else None


def checkpoint_max_len(path: Path) -> int | None:
    return checkpoint_field(path, "max_position_embeddings")


def guided_decoding(llmapi: Any, guide: Guide) -> Any:
    """``GuidedDecodingParams`` for a request's guide. TensorRT-LLM's llguidance backend compiles ``json``
    with ``grammar_from_json_schema`` and ``grammar`` as Lark. JSON goes as a schema carrying our JSON
    options in its ``x-guidance`` key (fixed separators, as the reference backend: llguidance's default
    lets a model pad with whitespace until max_tokens), ``json_object`` too (TensorRT-LLM's own
    ``json_object`` compiles ``{"type": "object"}`` with the defaults)."""
    if guide.kind in ("json_object", "json_schema"):
        schema: dict[str, Any] = {"type": "object"}
        if guide.kind == "json_schema":
            schema = json.loads(guide.source)
        options = {**JSON_DEFAULTS, **schema.get("x-guidance", {})}
        return llmapi.GuidedDecodingParams(json=json.dumps({**schema, "x-guidance": options}))
    if guide.kind == "lark":
        return llmapi.GuidedDecodingParams(grammar=guide.source)
    raise ValueError(f"backend {BACKEND} does not support response_format {guide.kind}")
