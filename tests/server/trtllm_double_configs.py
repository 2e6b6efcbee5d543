"""The double's LLM API config models (``tensorrt_llm.llmapi``'s ``KvCacheConfig``, ``SchedulerConfig`` and
the decoding configs), as strict as their pydantic originals (trtllm_double.py lists what differs).

The maintained path's classes (``SADecodingConfig``, ``SAEnhancerConfig``, ``PARDDecodingConfig``,
``DFlashDecodingConfig``, ``sa_config`` on Eagle3/MTP) and their validators were read in NVIDIA/TensorRT-LLM
``tensorrt_llm/llmapi/llm_args.py`` at commit 0004396720054fd8e205cbf616f21f0b57c6b412 (a 1.3.0rc2x main
state: no TensorRT backend, ``LlmArgs = TorchLlmArgs``); each field keeps its name and default."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from specdeploy_server.backends.llmapi_schedule import schedule_semantics

from tests.server.trtllm_double_executor import CapacitySchedulerPolicy


class ValidationError(ValueError):
    """What the LLM API's pydantic models raise (pydantic's ``ValidationError`` is a ``ValueError``)."""


def config_model(
    name: str,
    *,
    aliases: dict[str, str] | None = None,
    check: Callable[[Any], str | None] | None = None,
    **defaults: Any,
) -> type:
    """A config model of the LLM API (pydantic, extra fields forbidden): unknown keywords and failed
    validators raise ``ValidationError``; ``aliases`` maps an accepted alias to its field."""
    alias = aliases or {}

    def __init__(self: Any, **kwargs: Any) -> None:
        values = dict(defaults)
        for given, value in kwargs.items():
            key = alias.get(given, given)
            if key not in defaults:
                raise ValidationError(
                    f"1 validation error for {name}\n{given}\n  Extra inputs are not permitted"
                )
            values[key] = value
        for key, value in values.items():
            setattr(self, key, value)
        problem = check(self) if check is not None else None
        if problem is not None:
            raise ValidationError(f"1 validation error for {name}\n  Value error, {problem}")

    attributes = {
        "__init__": __init__,
        "__repr__": lambda self: f"{name}({vars(self)})",
        "model_fields": dict.fromkeys(defaults),  # pydantic's class attribute: field name -> FieldInfo
    }
    return type(name, (), attributes)


#: DecodingBaseConfig's load-aware fields, in every decoding config: max_concurrency (PositiveInt: off above
#: that many active requests), acceptance_rate_window_size (NonNegativeInt), acceptance_rate_threshold (0..1),
#: draft_len_schedule (batch-size thresholds -> draft length, 1.2 on)
LOAD_AWARE = {
    "max_concurrency": None,
    "acceptance_rate_window_size": None,
    "acceptance_rate_threshold": None,
    "draft_len_schedule": None,
}


def base_fields(config: Any) -> str | None:
    concurrency, window = config.max_concurrency, config.acceptance_rate_window_size
    threshold = config.acceptance_rate_threshold
    if concurrency is not None and (not isinstance(concurrency, int) or concurrency <= 0):
        return f"max_concurrency: Input should be greater than 0, got {concurrency}"
    if window is not None and (not isinstance(window, int) or window < 0):
        return f"acceptance_rate_window_size: Input should be greater than or equal to 0, got {window}"
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        return f"acceptance_rate_threshold: Input should be between 0 and 1, got {threshold}"
    schedule = config.draft_len_schedule
    if schedule is None:
        return None
    if not all(isinstance(b, int) and isinstance(k, int) and b >= 1 and k >= 0 for b, k in schedule.items()):
        return f"draft_len_schedule: batch sizes >= 1 and draft lengths >= 0, got {schedule}"
    return schedule_rules(config, schedule)


def schedule_rules(config: Any, schedule: dict[int, int]) -> str | None:
    """`validate_draft_len_schedule_and_sort` and the max_concurrency check of the installed version's
    `DecodingBaseConfig` (llm_args.py): up to 1.2, key 1 must map to max_draft_len; later, the smallest key
    must, no length may exceed it, and max_concurrency may not come beside a schedule."""
    longest = getattr(config, "max_draft_len", None)
    version = str(getattr(sys.modules.get("tensorrt_llm"), "__version__", "1.2.1"))
    if schedule_semantics(version) == "lower":
        if 1 not in schedule:
            return "draft_len_schedule must include batch_size=1"
        if longest is not None and schedule[1] != longest:
            return f"draft_len_schedule[1] must equal max_draft_len {longest}, got {schedule[1]}"
        return None
    smallest = min(schedule)
    if longest is not None and schedule[smallest] != longest:
        return f"draft_len_schedule[{smallest}] must equal max_draft_len {longest}, got {schedule[smallest]}"
    if longest is not None and any(k > longest for k in schedule.values()):
        return f"draft_len_schedule: all draft lengths must be <= max_draft_len {longest}"
    if config.max_concurrency is not None:
        return "max_concurrency and draft_len_schedule are mutually exclusive"
    return None


def needs_draft_len(config: Any) -> str | None:
    if config.max_draft_len is None or config.max_draft_len <= 0:
        return f"max_draft_len must be > 0, got {config.max_draft_len}"
    return base_fields(config)


def needs_model(config: Any) -> str | None:
    if config.speculative_model is None:
        return "a speculative model (speculative_model) is required"
    return needs_draft_len(config)


LlmKvCacheConfig = config_model("KvCacheConfig", enable_block_reuse=True, free_gpu_memory_fraction=None)
LlmSchedulerConfig = config_model(
    "SchedulerConfig", capacity_scheduler_policy=CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
)
MODEL_ALIAS = {"speculative_model_dir": "speculative_model"}
#: SAEnhancerConfig (a StrictBaseModel, not a decoding config): a suffix match of at least `threshold`
#: (PositiveInt) tokens overrides the neural draft; the value of `sa_config` on Eagle3, MTP and PARD configs
SAEnhancerConfig = config_model(
    "SAEnhancerConfig",
    check=lambda c: (
        None
        if isinstance(c.threshold, int) and c.threshold > 0
        else f"threshold: Input should be greater than 0, got {c.threshold}"
    ),
    threshold=4,
    enable_global_pool=False,
)


def needs_sa_enhancer(config: Any) -> str | None:
    if config.sa_config is not None and type(config.sa_config).__name__ != "SAEnhancerConfig":
        return f"sa_config: Input should be a valid SAEnhancerConfig, got {config.sa_config!r}"
    return None


def _model_and_sa(config: Any) -> str | None:
    return needs_model(config) or needs_sa_enhancer(config)


#: the fields of EagleDecodingConfig, which Eagle3DecodingConfig shares (Eagle3 adds sa_config)
_EAGLE: dict[str, Any] = {
    **LOAD_AWARE,
    "aliases": MODEL_ALIAS,
    "check": needs_model,
    "max_draft_len": None,
    "speculative_model": None,
    "eagle3_one_model": True,
}
EagleDecodingConfig = config_model("EagleDecodingConfig", **_EAGLE)
Eagle3DecodingConfig = config_model(
    "Eagle3DecodingConfig", **{**_EAGLE, "check": _model_and_sa}, sa_config=None
)
NGramDecodingConfig = config_model(
    "NGramDecodingConfig",
    **LOAD_AWARE,
    check=needs_draft_len,
    max_draft_len=None,
    max_matching_ngram_size=2,
    is_keep_all=True,
    is_use_oldest=True,
    is_public_pool=True,
)
DraftTargetDecodingConfig = config_model(
    "DraftTargetDecodingConfig",
    **LOAD_AWARE,
    aliases=MODEL_ALIAS,
    check=needs_model,
    max_draft_len=None,
    speculative_model=None,
)
MTPDecodingConfig = config_model(
    "MTPDecodingConfig",
    check=lambda c: base_fields(c) or needs_sa_enhancer(c),
    num_nextn_predict_layers=1,
    max_draft_len=None,
    sa_config=None,
    **LOAD_AWARE,
)


def _suffix_automaton(config: Any) -> str | None:
    """``SADecodingConfig.validate_sa_config``."""
    size = config.max_matching_ngram_size
    if size == 0:
        return "max_matching_ngram_size must be -1 (longest match) or a positive n-gram size, got 0"
    if config.enable_global_pool and size != -1 and not 1 <= size <= 64:
        return f"with the global pool max_matching_ngram_size must be -1 or in [1, 64], got {size}"
    if config.global_pool_size is not None and not config.enable_global_pool:
        return "global_pool_size requires enable_global_pool=True"
    if config.global_pool_size is not None and config.global_pool_size <= 0:
        return f"global_pool_size: Input should be greater than 0, got {config.global_pool_size}"
    return needs_draft_len(config)


#: decoding_type "SA": suffix-automaton drafting, no model (PyTorch backend only)
SADecodingConfig = config_model(
    "SADecodingConfig",
    **LOAD_AWARE,
    check=_suffix_automaton,
    max_draft_len=None,
    max_matching_ngram_size=-1,
    enable_global_pool=False,
    global_pool_size=None,
)
#: decoding_type "PARD": a parallel draft model (TorchLlmArgs asserts max_draft_len > 0; no validator
#: requires the model, loading does)
PARDDecodingConfig = config_model(
    "PARDDecodingConfig",
    **LOAD_AWARE,
    aliases=MODEL_ALIAS,
    check=lambda c: needs_draft_len(c) or needs_sa_enhancer(c),
    max_draft_len=None,
    speculative_model=None,
    mask_token_id=None,
    sa_config=None,
)


def _dflash(config: Any) -> str | None:
    if config.attention_backend not in ("VANILLA", "TRTLLM"):
        return f"attention_backend: Input should be 'VANILLA' or 'TRTLLM', got {config.attention_backend!r}"
    ids = config.target_layer_ids
    if ids is not None and not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
        return f"target_layer_ids: Input should be a valid list of integers, got {ids!r}"
    return needs_draft_len(config)


#: decoding_type "DFlash": a block-diffusion draft conditioned on target hidden states
DFlashDecodingConfig = config_model(
    "DFlashDecodingConfig",
    **LOAD_AWARE,
    aliases=MODEL_ALIAS,
    check=_dflash,
    max_draft_len=None,
    speculative_model=None,
    mask_token_id=None,
    target_layer_ids=None,
    attention_backend="VANILLA",
)
#: decoding_type AUTO: TensorRT-LLM's NGram heuristic (<= 4 active requests K=5/n=3, <= 32 K=3/n=5, above
#: that off); the base-class fields exist but are ignored
AutoDecodingConfig = config_model("AutoDecodingConfig", check=base_fields, max_draft_len=None, **LOAD_AWARE)
#: (draft length, longest n-gram) of the AUTO heuristic by active requests; None above the last bound
AUTO_NGRAM_SCHEDULE = ((4, 5, 3), (32, 3, 5))
