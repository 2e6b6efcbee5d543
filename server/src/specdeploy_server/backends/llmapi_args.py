"""What ``trtllm-llmapi`` hands TensorRT-LLM's LLM API: the ``LLM``'s keyword arguments (``TorchLlmArgs``
fields), the ``speculative_config`` per method, and a request's ``GuidedDecodingParams``."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy_server.backends.llmapi_drafter import RequestHints, drafter_class
from specdeploy_server.backends.llmapi_measured import read_measured, schedule_costs
from specdeploy_server.backends.llmapi_schedule import (
    COST_PRESET,
    Semantics,
    cap_schedule,
    draft_len_schedule,
    schedule_semantics,
)
from specdeploy_server.backends.llmapi_step_costs import WidthRule
from specdeploy_server.config import SA_ENHANCED_METHODS, Method, ServerConfig
from specdeploy_server.grammar import JSON_DEFAULTS, Guide

log = logging.getLogger(__name__)

BACKEND = "trtllm-llmapi"
#: Methods that draft from the text itself: no draft model's forward pass in a step's cost
MODEL_FREE_METHODS = frozenset({Method.PROMPT_LOOKUP, Method.NGRAM, Method.SUFFIX_AUTOMATON})
#: TensorRT-LLM's guided decoding backend: llguidance, as our own core (it also takes Lark grammars)
GUIDED_DECODING_BACKEND = "llguidance"


#: ``draftLen: auto`` on this backend: TensorRT-LLM turns speculation off for good once the true acceptance
#: rate (accepted / drafted) over the last this-many speculating iterations falls below the threshold
#: (``acceptance_rate_window_size`` / ``acceptance_rate_threshold`` of the decoding config, where the version
#: has them). Below 10 % a draft pays at no batch size worth serving; docs/trtllm.md.
AUTO_ACCEPTANCE_WINDOW = 128
AUTO_ACCEPTANCE_THRESHOLD = 0.1


def draft_len(config: ServerConfig) -> int:
    """Tokens per step: TensorRT-LLM proposes a fixed ``max_draft_len`` (it has no per-step choice of ours),
    so ``auto`` proposes ``maxDraftLen`` and leaves load and acceptance to :func:`load_aware_fields`."""
    spec = config.speculative
    return spec.max_draft_len if spec.draft_len == "auto" else spec.draft_len


def has_field(cls: Any, name: str) -> bool:
    """Whether this TensorRT-LLM version's decoding config class has a field (pydantic ``model_fields``)."""
    return name in getattr(cls, "model_fields", {})


def load_aware_fields(cls: Any, config: ServerConfig) -> dict[str, Any]:
    """``disableAboveConcurrency`` -> ``max_concurrency``; ``draftLen: auto`` -> the acceptance-rate gate;
    each only where the version's class has the field (otherwise a warning says what is not honoured)."""
    spec = config.speculative
    fields: dict[str, Any] = {}
    if spec.disable_above_concurrency is not None:
        if has_field(cls, "max_concurrency"):
            fields["max_concurrency"] = spec.disable_above_concurrency
        else:
            log.warning("%s has no max_concurrency: disableAboveConcurrency is not honoured", cls.__name__)
    if spec.draft_len == "auto":
        if has_field(cls, "acceptance_rate_window_size") and has_field(cls, "acceptance_rate_threshold"):
            fields["acceptance_rate_window_size"] = AUTO_ACCEPTANCE_WINDOW
            fields["acceptance_rate_threshold"] = AUTO_ACCEPTANCE_THRESHOLD
        else:
            log.warning(
                "%s has no acceptance-rate gate: draftLen auto drafts maxDraftLen %d whatever the acceptance",
                cls.__name__,
                spec.max_draft_len,
            )
    return fields


@dataclass(frozen=True)
class AutoSchedule:
    """``draftLen: auto``'s ``draft_len_schedule`` in the installed version's meaning, and where each input
    of the cost model came from (``measured`` or ``preset``)."""

    schedule: dict[int, int]
    semantics: Semantics
    sources: dict[str, str]


def auto_schedule(config: ServerConfig, version: str) -> AutoSchedule | None:
    """The schedule our cost model chooses from the measured costs file where it has figures and the preset
    elsewhere (llmapi_measured; the file is read here, once); None unless ``draftLen: auto`` speculates."""
    spec, method = config.speculative, config.method
    if spec.draft_len != "auto" or method == Method.NONE:
        return None
    drafts_with_a_model = method not in MODEL_FREE_METHODS
    costs = schedule_costs(
        read_measured(spec.measured_costs_file),
        COST_PRESET,
        max_draft_len=draft_len(config),
        drafts_with_a_model=drafts_with_a_model,
    )
    semantics = schedule_semantics(version)
    schedule = draft_len_schedule(
        draft_len(config),
        config.runtime.max_batch_size,
        semantics,
        drafts_with_a_model=drafts_with_a_model,
        costs=costs,
    )
    return AutoSchedule(schedule, semantics, costs.sources)


def schedule_field(cls: Any, config: ServerConfig, auto: AutoSchedule | None) -> dict[str, Any]:
    """``draft_len_schedule`` where the class has the field and the version's meaning covers the method
    (``lower``, 1.2 and earlier: two-model drafters only; ``upper``: every method)."""
    if auto is None or not has_field(cls, "draft_len_schedule"):
        return {}
    if auto.semantics == "lower" and config.method != Method.DRAFT_TARGET:
        return {}
    return {"draft_len_schedule": auto.schedule}


def load_aware(cls: Any, config: ServerConfig, auto: AutoSchedule | None) -> dict[str, Any]:
    """:func:`load_aware_fields` and :func:`schedule_field` together. Where the schedule's keys are upper
    bounds, TensorRT-LLM refuses ``max_concurrency`` beside a schedule: the schedule carries the ceiling."""
    fields = {**load_aware_fields(cls, config), **schedule_field(cls, config, auto)}
    schedule, ceiling = fields.get("draft_len_schedule"), fields.get("max_concurrency")
    if auto is not None and auto.semantics == "upper" and schedule is not None and ceiling is not None:
        del fields["max_concurrency"]
        fields["draft_len_schedule"] = cap_schedule(schedule, ceiling)
    return fields


def width_rule(config: ServerConfig, speculative_config: Any, auto: AutoSchedule | None) -> WidthRule | None:
    """How the executor will choose each iteration's draft width with these arguments (llmapi_step_costs);
    None without speculation, or where the widths are TensorRT-LLM's own (``AutoDecodingConfig``)."""
    if speculative_config is None or type(speculative_config).__name__ == "AutoDecodingConfig":
        return None
    schedule = getattr(speculative_config, "draft_len_schedule", None)
    if getattr(speculative_config, "drafter", None) is not None:  # our drafter took the schedule
        schedule = auto.schedule if auto is not None else None
    return WidthRule(
        max_draft_len=draft_len(config),
        schedule=schedule,
        semantics=auto.semantics if auto is not None else "lower",
        max_concurrency=config.speculative.disable_above_concurrency,
    )


def user_provided_config(
    llmapi: Any, config: ServerConfig, auto: AutoSchedule | None, hints: RequestHints | None
) -> Any | None:
    """promptLookup as our own drafter (llmapi_drafter) in ``UserProvidedDecodingConfig``; None (with a
    warning) where the installed version lacks the class or TensorRT-LLM's ``Drafter``."""
    cls = getattr(llmapi, "UserProvidedDecodingConfig", None)
    try:
        drafter_cls = drafter_class()
    except ImportError:
        drafter_cls = None
    if cls is None or drafter_cls is None:
        log.warning("no user-provided drafters in this TensorRT-LLM: promptLookup runs its NGram drafter")
        return None
    spec = config.speculative
    k = draft_len(config)
    drafter = drafter_cls(
        max_draft_len=k,
        prompt_lookup_ngram=spec.prompt_lookup.max_matching_ngram_size,
        hints=hints,
        max_concurrency=spec.disable_above_concurrency,
        draft_len_schedule=None if auto is None else auto.schedule,
    )
    return cls(max_draft_len=k, drafter=drafter, **load_aware_fields(cls, config))


def config_class(llmapi: Any, name: str, config: ServerConfig) -> Any:
    """TensorRT-LLM's class `name`, or a start-up error naming what the installed release lacks."""
    cls = getattr(llmapi, name, None)
    if cls is None:
        raise ValueError(
            f"speculative.method {config.method.value}: this TensorRT-LLM has no {name}; the method needs a "
            "newer release (docs/trtllm.md#methods)"
        )
    return cls


def sa_enhancer(llmapi: Any, config: ServerConfig) -> dict[str, Any]:
    """``sa_config`` for eagle3, mtp and pard with ``speculative.suffixAutomaton``: a suffix match at least
    ``threshold`` long overrides the neural draft."""
    sa = config.speculative.suffix_automaton
    if sa is None or config.method not in SA_ENHANCED_METHODS:
        return {}
    fields: dict[str, Any] = {"enable_global_pool": sa.global_pool}
    if sa.threshold is not None:
        fields["threshold"] = sa.threshold
    return {"sa_config": config_class(llmapi, "SAEnhancerConfig", config)(**fields)}


def maintained_path_config(llmapi: Any, config: ServerConfig, auto: AutoSchedule | None) -> Any:
    """The decoding config of ngram, suffixAutomaton, pard and dflash (classes of TensorRT-LLM 1.3 on)."""
    method, k, spec = config.method, draft_len(config), config.speculative
    if method == Method.NGRAM:
        cls = config_class(llmapi, "NGramDecodingConfig", config)
        return cls(
            max_draft_len=k,
            max_matching_ngram_size=spec.ngram.max_matching_ngram_size,
            is_keep_all=spec.ngram.keep_all,
            is_use_oldest=spec.ngram.use_oldest,
            is_public_pool=spec.ngram.public_pool,
            **load_aware(cls, config, auto),
        )
    if method == Method.SUFFIX_AUTOMATON:
        cls = config_class(llmapi, "SADecodingConfig", config)
        sa = spec.suffix_automaton
        fields: dict[str, Any] = {
            "max_matching_ngram_size": -1,  # the longest match
            "enable_global_pool": False,
        }
        if sa is not None:
            fields["enable_global_pool"] = sa.global_pool
            if sa.max_matching_ngram_size is not None:
                fields["max_matching_ngram_size"] = sa.max_matching_ngram_size
            if sa.global_pool_size is not None:
                fields["global_pool_size"] = sa.global_pool_size
        return cls(max_draft_len=k, **fields, **load_aware(cls, config, auto))
    model = {"speculative_model": str(config.model.speculative_model)}
    if method == Method.PARD:
        cls = config_class(llmapi, "PARDDecodingConfig", config)
        extra: dict[str, Any] = {}
        if spec.pard.mask_token_id is not None:
            extra["mask_token_id"] = spec.pard.mask_token_id
        return cls(
            max_draft_len=k,
            **model,
            **extra,
            **sa_enhancer(llmapi, config),
            **load_aware(cls, config, auto),
        )
    if method == Method.DFLASH:
        cls = config_class(llmapi, "DFlashDecodingConfig", config)
        extra = {}
        if spec.dflash.mask_token_id is not None:
            extra["mask_token_id"] = spec.dflash.mask_token_id
        if spec.dflash.target_layer_ids is not None:
            extra["target_layer_ids"] = list(spec.dflash.target_layer_ids)
        return cls(
            max_draft_len=k,
            **model,
            **extra,
            **load_aware(cls, config, auto),
        )
    raise ValueError(f"speculative.method {method.value} is not supported by {BACKEND}")


def speculative_config(
    llmapi: Any, config: ServerConfig, auto: AutoSchedule | None, hints: RequestHints | None = None
) -> Any:
    """The ``speculative_config`` for our method (None for plain decoding); ``auto``: the schedule of
    ``draftLen: auto`` (:func:`auto_schedule`); ``hints``: the channel for per-request speculation
    (promptLookup, single process)."""
    method, k, spec = config.method, draft_len(config), config.speculative
    if method == Method.NONE or k == 0:
        return None
    if method == Method.DRAFT_TARGET:
        cls = llmapi.DraftTargetDecodingConfig
        draft = str(config.model.draft)
        return cls(
            max_draft_len=k,
            speculative_model_dir=draft,
            **load_aware(cls, config, auto),
        )
    if method == Method.PROMPT_LOOKUP:
        ours = user_provided_config(llmapi, config, auto, hints)
        if ours is not None:
            return ours
        auto = getattr(llmapi, "AutoDecodingConfig", None)
        if spec.draft_len == "auto" and spec.disable_above_concurrency is None and auto is not None:
            # TensorRT-LLM's NGram heuristic: K and n by active requests, off above 32 (it ignores the
            # base-class fields, so a hard disableAboveConcurrency takes the NGram path below instead).
            return auto()
        cls = llmapi.NGramDecodingConfig
        # Per-request pools and the oldest match: the semantics of our own promptLookup.
        return cls(
            max_draft_len=k,
            max_matching_ngram_size=spec.prompt_lookup.max_matching_ngram_size,
            is_keep_all=True,
            is_use_oldest=True,
            is_public_pool=False,
            **load_aware_fields(cls, config),
        )
    if method == Method.EAGLE3:
        # Newer releases name the class Eagle3DecodingConfig; 1.0-1.2 run EAGLE-3 via EagleDecodingConfig.
        cls = getattr(llmapi, "Eagle3DecodingConfig", None) or llmapi.EagleDecodingConfig
        return cls(
            max_draft_len=k,
            speculative_model_dir=str(config.model.speculative_model),
            **sa_enhancer(llmapi, config),
            **load_aware(cls, config, auto),
        )
    if method == Method.MTP:
        cls = llmapi.MTPDecodingConfig
        fields = load_aware(cls, config, auto)
        # Both: 1.2 takes the layers and overwrites max_draft_len with them; 1.3 derives the layers from the
        # checkpoint and maps the old name onto max_draft_len.
        return cls(num_nextn_predict_layers=k, max_draft_len=k, **sa_enhancer(llmapi, config), **fields)
    return maintained_path_config(llmapi, config, auto)


def llm_arguments(
    llmapi: Any,
    config: ServerConfig,
    tokenizer: Path,
    auto: AutoSchedule | None,
    hints: RequestHints | None = None,
) -> dict[str, Any]:
    """Keyword arguments of ``tensorrt_llm.LLM`` (the LLM API's ``TorchLlmArgs`` fields)."""
    runtime = config.runtime
    policy = (
        llmapi.CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
        if runtime.guaranteed_no_evict
        else llmapi.CapacitySchedulerPolicy.MAX_UTILIZATION
    )
    spec = speculative_config(llmapi, config, auto, hints)
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
    if spec is not None:
        # Each iteration's latency and batch: the measured pass costs of llmapi_step_costs.
        args["enable_iter_perf_stats"] = True
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
