"""Settings of the methods only TensorRT-LLM's LLM API runs (backend trtllm-llmapi): TensorRT-LLM's n-gram
drafter, the suffix automaton (alone or overriding a neural draft), PARD and DFlash. Field names are the
operator's (`spec.speculative.<method>`); llmapi_args maps each onto TensorRT-LLM's decoding config."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

__all__ = ["DflashConfig", "NgramConfig", "PardConfig", "SuffixAutomatonConfig"]


class _Settings(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class NgramConfig(_Settings):
    """TensorRT-LLM's n-gram drafter (``NGramDecodingConfig``)."""

    max_matching_ngram_size: int = Field(default=2, ge=1, description="Longest n-gram matched.")
    keep_all: bool = Field(default=True, description="Keep every continuation of a pattern (is_keep_all).")
    use_oldest: bool = Field(default=True, description="Propose the oldest continuation (is_use_oldest).")
    public_pool: bool = Field(default=True, description="One pool for all requests (is_public_pool).")


class SuffixAutomatonConfig(_Settings):
    """Suffix-automaton drafting: alone (``SADecodingConfig``) or overriding the drafts of eagle3, mtp or pard
    (``sa_config``: ``SAEnhancerConfig``)."""

    max_matching_ngram_size: int | None = Field(
        default=None, ge=1, description="Alone: match exactly this many tokens; null: the longest match."
    )
    global_pool: bool = Field(default=False, description="Also match other requests' text.")
    global_pool_size: int | None = Field(default=None, ge=1, description="Alone: requests the pool holds.")
    threshold: int | None = Field(
        default=None, ge=1, description="With a neural draft: shortest match that overrides it (default 4)."
    )


class PardConfig(_Settings):
    """PARD (``PARDDecodingConfig``); the draft is ``model.speculativeModel``."""

    mask_token_id: int | None = Field(default=None, ge=0, description="null: the draft's config decides.")


class DflashConfig(_Settings):
    """DFlash (``DFlashDecodingConfig``); the draft is ``model.speculativeModel``."""

    mask_token_id: int | None = Field(default=None, ge=0, description="null: from the draft's dflash_config.")
    target_layer_ids: list[int] | None = Field(
        default=None, min_length=1, description="null: from the draft's dflash_config."
    )
