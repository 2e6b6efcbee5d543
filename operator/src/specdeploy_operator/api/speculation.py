"""How a SpeculativeDeployment speculates (`spec.speculative`): the method, the draft lengths and the
settings of prompt lookup and EAGLE-3, with their cross-field rules."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from .base import ApiModel, Rule, Rules
from .checkpoint import ModelSource

__all__ = [
    "SPECULATIVE_RULES",
    "DraftLen",
    "EagleSpec",
    "PromptLookupSpec",
    "SpeculativeMethod",
    "SpeculativeSpec",
]

SpeculativeMethod = Literal["draftTarget", "promptLookup", "eagle3", "mtp", "none"]


def _draft_len_within_max(s: SpeculativeSpec) -> bool:
    return s.draft_len is None or s.draft_len == "auto" or s.draft_len <= s.max_draft_len


SPECULATIVE_RULES: Rules = (
    Rule["SpeculativeSpec"](
        name="draft-len-within-max",
        cel="!has(self.draftLen) || type(self.draftLen) == string || self.draftLen <= self.maxDraftLen",
        message="spec.speculative.draftLen must not exceed spec.speculative.maxDraftLen",
        field_path=".draftLen",
        check=_draft_len_within_max,
    ),
    Rule["SpeculativeSpec"](
        name="logits-need-draft-target",
        cel="self.acceptance != 'logits' || self.method == 'draftTarget'",
        message="spec.speculative.acceptance logits needs spec.speculative.method draftTarget "
        "(only a draft model produces logits)",
        field_path=".acceptance",
        check=lambda s: s.acceptance != "logits" or s.method == "draftTarget",
    ),
    Rule["SpeculativeSpec"](
        name="eagle-required",
        cel="self.method != 'eagle3' || has(self.eagle)",
        message="spec.speculative.eagle is required when spec.speculative.method is eagle3",
        field_path=".eagle",
        check=lambda s: s.method != "eagle3" or s.eagle is not None,
        reason="FieldValueRequired",
    ),
    Rule["SpeculativeSpec"](
        name="eagle-only-for-eagle3",
        cel="self.method == 'eagle3' || !has(self.eagle)",
        message="spec.speculative.eagle must not be set unless spec.speculative.method is eagle3",
        field_path=".eagle",
        check=lambda s: s.method == "eagle3" or s.eagle is None,
        reason="FieldValueForbidden",
    ),
    Rule["SpeculativeSpec"](
        name="prompt-lookup-only-for-prompt-lookup",
        cel="self.method == 'promptLookup' || !has(self.promptLookup)",
        message="spec.speculative.promptLookup must not be set unless "
        "spec.speculative.method is promptLookup",
        field_path=".promptLookup",
        check=lambda s: s.method == "promptLookup" or s.prompt_lookup is None,
        reason="FieldValueForbidden",
    ),
)


def _draft_len(value: object) -> int | str:
    # bool is an int in Python but not a draft length; the apiserver's int-or-string rejects it too.
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 64:
        return value
    if value == "auto":
        return "auto"
    raise PydanticCustomError("draft_len", "must be an integer from 1 to 64 or 'auto'")


DraftLen = Annotated[
    int | Literal["auto"],
    PlainValidator(_draft_len),
    WithJsonSchema(
        {
            "x-kubernetes-int-or-string": True,
            "anyOf": [{"type": "integer"}, {"type": "string"}],
            "pattern": "^auto$",
            "minimum": 1,
            "maximum": 64,
        }
    ),
]
"""A draft length: an integer from 1 to 64, or `auto`."""


class PromptLookupSpec(ApiModel):
    """Prompt-lookup (n-gram) drafting settings."""

    max_matching_ngram_size: Annotated[int, Field(ge=1, le=32)] = 2
    """Longest n-gram from the end of the text that is searched for in the prompt and output so far
    (`max_matching_ngram_size`)."""


class EagleSpec(ApiModel):
    """EAGLE-3 drafting settings."""

    model: ModelSource
    """The EAGLE-3 draft head checkpoint (`speculative_model_dir`), trained for the target model."""


class SpeculativeSpec(ApiModel):
    """Which speculative decoding method runs, and how many tokens it proposes."""

    validation_rules: ClassVar[Rules] = SPECULATIVE_RULES

    method: SpeculativeMethod
    """`draftTarget`: a separate draft model proposes tokens (needs `spec.draft`). `promptLookup`: tokens are
    copied from matching n-grams of the prompt and output. `eagle3` / `mtp`: a draft head or multi-token
    prediction layers (backend `pytorch` only). `none`: plain decoding, the baseline for A/B comparisons."""
    draft_len: DraftLen | None = None
    """Tokens proposed per step (`draft_len`, `prompt_lookup_num_tokens`), at most `maxDraftLen`; or `auto`,
    also what unset means: per step and per sequence the server chooses the draft length (0 to `maxDraftLen`)
    that maximises the whole batch's expected tokens per second, from step costs it measures at the current
    batch size and each sequence's acceptance, so speculation fades out as load makes verification
    compute-bound (docs/server.md). With backend `pytorch` TensorRT-LLM drafts `maxDraftLen` and turns
    speculation off for good when acceptance stays below 10 % (docs/trtllm.md)."""
    disable_above_concurrency: Annotated[int, Field(ge=1, le=65536)] | None = None
    """A hard rule on top of the draft length: in a step with more than this many concurrent sequences nobody
    drafts (TensorRT-LLM's `max_concurrency` with backend `pytorch`). Unset: no such rule."""
    max_draft_len: Annotated[int, Field(ge=1, le=64)] = 10
    """Most draft tokens the engine accepts per step: the target engine's `--max_draft_len`, or
    `max_draft_len` of the PyTorch backend's `speculative_config`."""
    acceptance: Literal["tokenMatch", "logits"] = "tokenMatch"
    """How draft tokens are accepted: `tokenMatch` compares tokens with the target's; `logits` uses rejection
    sampling on draft and target logits (`use_logits`), `draftTarget` with backend `tensorrt` or
    `transformers` only (with `pytorch`, TensorRT-LLM's LLM API decides acceptance itself)."""
    prompt_lookup: PromptLookupSpec | None = None
    """Settings of `promptLookup`; only with that method."""
    eagle: EagleSpec | None = None
    """Settings of `eagle3`; required with that method, forbidden otherwise."""

    @property
    def effective_draft_len(self) -> int | Literal["auto"]:
        """Tokens proposed per step, or `auto` (also the default)."""
        return "auto" if self.draft_len is None else self.draft_len
