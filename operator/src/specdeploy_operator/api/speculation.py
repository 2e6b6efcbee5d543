"""How a SpeculativeDeployment speculates (`spec.speculative`): the method, the draft lengths and each
method's settings, with their cross-field rules."""

from __future__ import annotations

from typing import Annotated, ClassVar, Final, Literal

from pydantic import Field, PlainValidator, WithJsonSchema
from pydantic_core import PydanticCustomError

from .base import ApiModel, Rule, Rules
from .checkpoint import ModelSource

__all__ = [
    "EAGLE3_BACKENDS",
    "MAINTAINED_PATH_METHODS",
    "SA_ENHANCED_METHODS",
    "SPECULATIVE_RULES",
    "DflashSpec",
    "DraftLen",
    "EagleSpec",
    "NgramSpec",
    "PardSpec",
    "PromptLookupSpec",
    "SpeculativeMethod",
    "SpeculativeSpec",
    "SuffixAutomatonSpec",
]

SpeculativeMethod = Literal[
    "draftTarget", "promptLookup", "ngram", "suffixAutomaton", "eagle3", "mtp", "pard", "dflash", "none"
]
MAINTAINED_PATH_METHODS: Final = ("ngram", "suffixAutomaton", "mtp", "pard", "dflash")
"""Methods only TensorRT-LLM's PyTorch path runs (backend `pytorch`)."""
EAGLE3_BACKENDS: Final = ("pytorch", "transformers")
"""Where `eagle3` runs: TensorRT-LLM's PyTorch path, and our own loop on `transformers`."""
SA_ENHANCED_METHODS: Final = ("eagle3", "mtp", "pard")
"""Methods whose drafts a suffix automaton can override (TensorRT-LLM's `sa_config`)."""
_SA_METHODS: Final = ("suffixAutomaton", *SA_ENHANCED_METHODS)


def _settings_rules(field: str, method: str, attr: str, *, required: bool) -> list[Rule[SpeculativeSpec]]:
    """`spec.speculative.<field>` is required with (or only allowed with) `method`."""
    rules: list[Rule[SpeculativeSpec]] = []
    if required:
        rules.append(
            Rule["SpeculativeSpec"](
                name=f"{field}-required",
                cel=f"self.method != '{method}' || has(self.{field})",
                message=f"spec.speculative.{field} is required when spec.speculative.method is {method}",
                field_path=f".{field}",
                check=lambda s: s.method != method or getattr(s, attr) is not None,
                reason="FieldValueRequired",
            )
        )
    rules.append(
        Rule["SpeculativeSpec"](
            name=f"{field}-only-for-{method}",
            cel=f"self.method == '{method}' || !has(self.{field})",
            message=f"spec.speculative.{field} must not be set unless spec.speculative.method is {method}",
            field_path=f".{field}",
            check=lambda s: s.method == method or getattr(s, attr) is None,
            reason="FieldValueForbidden",
        )
    )
    return rules


def _sa_fields_fit(s: SpeculativeSpec) -> bool:
    sa = s.suffix_automaton
    if sa is None:
        return True
    if s.method == "suffixAutomaton":
        return sa.threshold is None
    return sa.max_matching_ngram_size is None and sa.global_pool_size is None


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
        cel="self.acceptance != 'logits' || self.method in ['draftTarget', 'eagle3']",
        message="spec.speculative.acceptance logits needs spec.speculative.method draftTarget or eagle3 "
        "(only a draft model or head produces logits)",
        field_path=".acceptance",
        check=lambda s: s.acceptance != "logits" or s.method in ("draftTarget", "eagle3"),
    ),
    *_settings_rules("eagle", "eagle3", "eagle", required=True),
    *_settings_rules("pard", "pard", "pard", required=True),
    *_settings_rules("dflash", "dflash", "dflash", required=True),
    *_settings_rules("ngram", "ngram", "ngram", required=False),
    Rule["SpeculativeSpec"](
        name="prompt-lookup-only-for-prompt-lookup",
        cel="self.method == 'promptLookup' || !has(self.promptLookup)",
        message="spec.speculative.promptLookup must not be set unless "
        "spec.speculative.method is promptLookup",
        field_path=".promptLookup",
        check=lambda s: s.method == "promptLookup" or s.prompt_lookup is None,
        reason="FieldValueForbidden",
    ),
    Rule["SpeculativeSpec"](
        name="suffix-automaton-methods",
        cel=f"!has(self.suffixAutomaton) || self.method in {list(_SA_METHODS)}",
        message="spec.speculative.suffixAutomaton must not be set unless spec.speculative.method is "
        "suffixAutomaton, or eagle3, mtp or pard (whose drafts it can then override)",
        field_path=".suffixAutomaton",
        check=lambda s: s.suffix_automaton is None or s.method in _SA_METHODS,
        reason="FieldValueForbidden",
    ),
    Rule["SpeculativeSpec"](
        name="suffix-automaton-fields-fit-the-method",
        cel="!has(self.suffixAutomaton) || (self.method == 'suffixAutomaton' ? "
        "!has(self.suffixAutomaton.threshold) : "
        "!has(self.suffixAutomaton.maxMatchingNgramSize) && !has(self.suffixAutomaton.globalPoolSize))",
        message="spec.speculative.suffixAutomaton.threshold is only for eagle3, mtp and pard; "
        "maxMatchingNgramSize and globalPoolSize only for method suffixAutomaton",
        field_path=".suffixAutomaton",
        check=_sa_fields_fit,
        reason="FieldValueForbidden",
    ),
    Rule["SpeculativeSpec"](
        name="suffix-automaton-pool-size-needs-global-pool",
        cel="!has(self.suffixAutomaton) || !has(self.suffixAutomaton.globalPoolSize) || "
        "self.suffixAutomaton.globalPool",
        message="spec.speculative.suffixAutomaton.globalPoolSize needs globalPool: true",
        field_path=".suffixAutomaton.globalPoolSize",
        check=lambda s: (
            s.suffix_automaton is None
            or s.suffix_automaton.global_pool_size is None
            or s.suffix_automaton.global_pool
        ),
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


class NgramSpec(ApiModel):
    """TensorRT-LLM's own n-gram drafter (`NGramDecodingConfig`); unset fields keep its defaults."""

    max_matching_ngram_size: Annotated[int, Field(ge=1, le=32)] = 2
    """Longest n-gram matched (`max_matching_ngram_size`)."""
    keep_all: bool = True
    """Keep every candidate continuation of a pattern, not only the newest (`is_keep_all`)."""
    use_oldest: bool = True
    """Propose the oldest candidate, not the newest (`is_use_oldest`)."""
    public_pool: bool = True
    """One pool shared by all requests (`is_public_pool`); false: one per request, as `promptLookup`."""


class SuffixAutomatonSpec(ApiModel):
    """Suffix-automaton (SA) drafting: alone (method `suffixAutomaton`, `SADecodingConfig`), or overriding
    the drafts of `eagle3`, `mtp` or `pard` where its match is long enough (`sa_config`)."""

    max_matching_ngram_size: Annotated[int, Field(ge=1, le=64)] | None = None
    """Method `suffixAutomaton`: match exactly this many tokens; unset: the longest match
    (`max_matching_ngram_size` -1)."""
    global_pool: bool = False
    """Also match the text of other requests (`enable_global_pool`)."""
    global_pool_size: Annotated[int, Field(ge=1, le=65536)] | None = None
    """Method `suffixAutomaton` with `globalPool`: requests the pool holds (`global_pool_size`); at least
    `spec.runtime.maxBatchSize`, as TensorRT-LLM checks at start-up."""
    threshold: Annotated[int, Field(ge=1, le=64)] | None = None
    """With `eagle3`, `mtp` or `pard`: the shortest suffix match that overrides the neural draft
    (`SAEnhancerConfig.threshold`; unset: TensorRT-LLM's 4)."""


class PardSpec(ApiModel):
    """PARD: a small draft model trained to predict several tokens in one pass (`PARDDecodingConfig`)."""

    model: ModelSource
    """The PARD draft checkpoint (`speculative_model`), e.g. `hf://amd/PARD-Llama-3.2-1B`."""
    mask_token_id: Annotated[int, Field(ge=0)] | None = None
    """Token fed at the masked positions (`mask_token_id`); unset: the draft's config decides."""


class DflashSpec(ApiModel):
    """DFlash: a block-diffusion draft conditioned on target hidden states (`DFlashDecodingConfig`)."""

    model: ModelSource
    """The DFlash draft checkpoint (`speculative_model`); its `config.json` `dflash_config` names the target
    layers and mask token unless set here."""
    mask_token_id: Annotated[int, Field(ge=0)] | None = None
    """Token fed at the masked positions (`mask_token_id`); unset: from the draft's `dflash_config`."""
    target_layer_ids: (
        Annotated[list[Annotated[int, Field(ge=0)]], Field(min_length=1, max_length=64)] | None
    ) = None
    """Target layers whose hidden states feed the draft (`target_layer_ids`); unset: from `dflash_config`."""


class SpeculativeSpec(ApiModel):
    """Which speculative decoding method runs, and how many tokens it proposes."""

    validation_rules: ClassVar[Rules] = SPECULATIVE_RULES

    method: SpeculativeMethod
    """`draftTarget`: a separate draft model proposes tokens (needs `spec.draft`). `promptLookup`: tokens are
    copied from matching n-grams of the prompt and output (our drafter). Backend `pytorch` only: `ngram`
    (TensorRT-LLM's n-gram drafter), `suffixAutomaton` (suffix-automaton matching, no model), `eagle3` / `mtp`
    (a draft head or multi-token prediction layers), `pard` / `dflash` (a parallel or block-diffusion draft
    model). `none`: plain decoding, the baseline for A/B comparisons. The release each needs:
    docs/trtllm.md#methods."""
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
    `transformers` and `eagle3` with `transformers` only (with `pytorch`, TensorRT-LLM's LLM API decides
    acceptance itself)."""
    prompt_lookup: PromptLookupSpec | None = None
    """Settings of `promptLookup`; only with that method."""
    eagle: EagleSpec | None = None
    """Settings of `eagle3`; required with that method, forbidden otherwise."""
    ngram: NgramSpec | None = None
    """Settings of `ngram`; only with that method."""
    suffix_automaton: SuffixAutomatonSpec | None = None
    """Settings of `suffixAutomaton`, or with `eagle3`, `mtp` or `pard` the suffix automaton that overrides
    their drafts (needs a newer release: docs/trtllm.md#methods)."""
    pard: PardSpec | None = None
    """Settings of `pard`; required with that method, forbidden otherwise."""
    dflash: DflashSpec | None = None
    """Settings of `dflash`; required with that method, forbidden otherwise."""

    @property
    def effective_draft_len(self) -> int | Literal["auto"]:
        """Tokens proposed per step, or `auto` (also the default)."""
        return "auto" if self.draft_len is None else self.draft_len

    @property
    def speculative_model(self) -> ModelSource | None:
        """The draft checkpoint TensorRT-LLM loads as `speculative_model`: the EAGLE-3 head, the PARD or
        DFlash draft."""
        for settings in (self.eagle, self.pard, self.dflash):
            if settings is not None:
                return settings.model
        return None
