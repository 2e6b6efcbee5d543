"""The server configuration: one pydantic model, read from a JSON/YAML file and overridden by CLI flags.

This is the contract the operator renders into a ConfigMap. Field names in files are camelCase (Python
attribute
names are snake_case); unknown keys are rejected so that a typo fails at start-up instead of being ignored.
"""

from __future__ import annotations

import enum
import hashlib
import importlib.util
import json
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic.alias_generators import to_camel

from specdeploy_server.method_settings import DflashConfig, NgramConfig, PardConfig, SuffixAutomatonConfig


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class Backend(enum.StrEnum):
    AUTO = "auto"
    PYTORCH_REFERENCE = "pytorch-reference"
    TRTLLM_ENGINE = "trtllm-engine"
    TRTLLM_LLMAPI = "trtllm-llmapi"


class Method(enum.StrEnum):
    DRAFT_TARGET = "draftTarget"
    PROMPT_LOOKUP = "promptLookup"
    EAGLE3 = "eagle3"  # backends trtllm-llmapi and pytorch-reference
    # backend trtllm-llmapi only:
    NGRAM = "ngram"
    SUFFIX_AUTOMATON = "suffixAutomaton"
    MTP = "mtp"
    PARD = "pard"
    DFLASH = "dflash"
    NONE = "none"


#: Methods only TensorRT-LLM's LLM API runs (our speculative loop cannot drive them).
LLMAPI_ONLY_METHODS = frozenset(
    {Method.NGRAM, Method.SUFFIX_AUTOMATON, Method.MTP, Method.PARD, Method.DFLASH}
)
#: Methods whose draft is a checkpoint of its own (``model.speculativeModel``).
SPECULATIVE_MODEL_METHODS = frozenset({Method.EAGLE3, Method.PARD, Method.DFLASH})
#: Methods whose drafts a suffix automaton may override (``speculative.suffixAutomaton``).
SA_ENHANCED_METHODS = frozenset({Method.EAGLE3, Method.MTP, Method.PARD})


class Acceptance(enum.StrEnum):
    TOKEN_MATCH = "tokenMatch"
    LOGITS = "logits"


class ModelConfig(_Model):
    target: Path = Field(
        description="Target model directory: a Hugging Face checkpoint or a TensorRT-LLM engine."
    )
    draft: Path | None = Field(
        default=None, description="Draft model directory (same vocabulary as the target)."
    )
    tokenizer: Path | None = Field(
        default=None, description="Tokenizer directory; default: the target directory."
    )
    served_model_name: str | None = Field(
        default=None,
        min_length=1,
        pattern=r"^\S+$",
        description="Name in /v1/models, in every response's `model` field and in the metrics' `model` "
        "label; default: the target directory's name.",
    )
    served_model_aliases: list[Annotated[str, Field(min_length=1, pattern=r"^\S+$")]] = Field(
        default_factory=list,
        description="Other names a request may send for this model; it is answered under servedModelName.",
    )
    dtype: Literal["auto", "float32", "float16", "bfloat16", "float64"] = Field(
        default="auto",
        description="Weights/activation dtype (reference backend): auto = float32 on CPU, else as stored.",
    )
    max_model_len: int | None = Field(
        default=None, ge=2, description="Context length limit; default: the target's max_position_embeddings."
    )
    speculative_model: Path | None = Field(
        default=None,
        description="Draft checkpoint TensorRT-LLM loads itself (`speculative_model`): the EAGLE-3 head, "
        "the PARD or DFlash draft; methods eagle3, pard and dflash only.",
    )

    @model_validator(mode="after")
    def _aliases_distinct(self) -> ModelConfig:
        if len(set(self.names)) != len(self.names):
            raise ValueError("model.servedModelAliases: each alias once, none equal to the served model name")
        return self

    @property
    def name(self) -> str:
        return self.served_model_name or self.target.resolve().name

    @property
    def names(self) -> tuple[str, ...]:
        """Every name a request may send: the served model name first, then the aliases."""
        return (self.name, *self.served_model_aliases)


class PromptLookupConfig(_Model):
    max_matching_ngram_size: int = Field(default=2, ge=1, description="Longest suffix n-gram to match.")


class SpeculativeConfig(_Model):
    method: Method | None = Field(
        default=None,
        description="draftTarget | promptLookup | none, or on trtllm-llmapi also ngram | suffixAutomaton | "
        "eagle3 | mtp | pard | dflash; default: draftTarget with a draft, else none.",
    )
    draft_len: int | Literal["auto"] = Field(
        default=4,
        description="Draft tokens per step, or `auto`: per step and per sequence, the draft lengths that "
        "maximise the batch's expected tokens/s from measured step costs at the current batch size and each "
        "sequence's acceptance (docs/server.md).",
    )
    max_draft_len: int = Field(
        default=10, ge=0, description="Upper bound for draftLen (the engine's max_draft_len)."
    )
    disable_above_concurrency: int | None = Field(
        default=None,
        ge=1,
        description="Above this many sequences in a step nobody drafts, whatever draftLen (TensorRT-LLM: "
        "max_concurrency of the decoding config); null: no such rule.",
    )
    acceptance: Acceptance = Field(
        default=Acceptance.TOKEN_MATCH,
        description="tokenMatch (use_logits=False) | logits (rejection sampling).",
    )
    prompt_lookup: PromptLookupConfig = Field(default_factory=PromptLookupConfig)
    ngram: NgramConfig = Field(default_factory=NgramConfig, description="Method ngram's settings.")
    suffix_automaton: SuffixAutomatonConfig | None = Field(
        default=None,
        description="Method suffixAutomaton's settings; with eagle3, mtp or pard: a suffix automaton that "
        "overrides their drafts.",
    )
    pard: PardConfig = Field(default_factory=PardConfig, description="Method pard's settings.")
    dflash: DflashConfig = Field(default_factory=DflashConfig, description="Method dflash's settings.")
    measured_costs_file: Path | None = Field(
        default=None,
        description="trtllm-llmapi, draftLen auto: pass costs and acceptance earlier pods measured (JSON, "
        "docs/trtllm.md), read at start-up for draft_len_schedule; a missing file: the preset estimates.",
    )

    @field_validator("draft_len")
    @classmethod
    def _draft_len_non_negative(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError("draftLen must be >= 0 or 'auto'")
        return value

    @model_validator(mode="after")
    def _draft_len_within_max(self) -> SpeculativeConfig:
        if isinstance(self.draft_len, int) and self.draft_len > self.max_draft_len:
            raise ValueError(f"draftLen {self.draft_len} exceeds maxDraftLen {self.max_draft_len}")
        return self


class PlacementConfig(_Model):
    device: Literal["auto", "cpu", "cuda"] = Field(default="auto", description="auto = cuda when available.")
    target_device_ids: list[int] = Field(
        default_factory=lambda: [0], description="GPUs of the target (TP size)."
    )
    draft_device_ids: list[int] = Field(
        default_factory=lambda: [0], description="GPUs of the draft (TP size)."
    )
    cpu_threads: int | None = Field(default=None, ge=1, description="torch CPU threads (reference backend).")


class RuntimeConfig(_Model):
    max_batch_size: int = Field(default=64, ge=1, description="Sequences stepped together.")
    max_queue_size: int | None = Field(
        default=0,
        ge=0,
        description=(
            "Requests waiting beyond the running batch before new ones get 503. 0 (the default) or null:"
            " no limit, as TensorRT-LLM's executor and llgtrt read max_queue_size 0 or unset; a positive"
            " number N: at most N waiting."
        ),
    )
    max_num_tokens: int = Field(default=8192, ge=1, description="TensorRT-LLM: tokens per engine iteration.")
    kv_cache_free_gpu_mem_fraction: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="TensorRT-LLM: fraction of free GPU memory for the KV cache, per executor.",
    )
    draft_kv_cache_free_gpu_mem_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Same for the draft executor; default: kvCacheFreeGpuMemFraction.",
    )
    enable_kv_cache_reuse: bool = Field(
        default=True, description="TensorRT-LLM: KV block reuse (required for DTM)."
    )
    enable_chunked_context: bool = Field(default=True, description="TensorRT-LLM: chunked prefill.")
    guaranteed_no_evict: bool = Field(default=False, description="TensorRT-LLM capacity scheduler policy.")
    max_seq_len: int | None = Field(
        default=None, ge=2, description="trtllm-llmapi: longest sequence (engines fix it at build time)."
    )
    kv_cache_host_memory_megabytes: int | None = Field(
        default=None, ge=0, description="TensorRT-LLM: host memory for offloaded KV blocks, MiB."
    )
    kv_cache_onboard_blocks: bool | None = Field(
        default=None, description="TensorRT-LLM: copy offloaded blocks back before use."
    )
    enable_batch_size_tuning: bool | None = Field(
        default=None, description="TensorRT-LLM: dynamic batch size tuning."
    )
    enable_max_num_tokens_tuning: bool | None = Field(
        default=None, description="TensorRT-LLM: dynamic max_num_tokens tuning."
    )
    cross_kv_cache_fraction: float | None = Field(
        default=None, gt=0, le=1, description="TensorRT-LLM: cross-attention KV share (encoder-decoder)."
    )
    secondary_offload_min_priority: int | None = Field(
        default=None, ge=0, le=100, description="TensorRT-LLM: lowest block priority offloaded to host."
    )
    event_buffer_max_size: int | None = Field(
        default=None, ge=0, description="TensorRT-LLM: KV cache event buffer size (0 = off)."
    )


class ServingConfig(_Model):
    host: str = "0.0.0.0"
    port: int = Field(default=8000, ge=0, le=65535)
    api_key_file: Path | None = Field(default=None, description="File holding the API key (Bearer token).")
    api_key_env: str | None = Field(default=None, description="Environment variable holding the API key.")
    chat_template: Path | None = Field(
        default=None, description="Jinja chat template; default: the tokenizer's."
    )
    shutdown_timeout_seconds: float = Field(
        default=30.0,
        ge=0,
        description="Seconds in-flight requests get after SIGTERM before they are aborted; the pod's "
        "terminationGracePeriodSeconds should be at least preStop + ceil(this) + 5 (docs/server.md).",
    )
    default_max_tokens: int = Field(
        default=16, ge=1, description="max_tokens of /v1/completions when omitted."
    )
    max_request_body_bytes: int = Field(
        default=16 * 1024 * 1024,
        ge=1,
        description="Largest request body; a larger one gets 413 without being read whole.",
    )
    unknown_fields: Literal["warn", "refuse"] = Field(
        default="warn",
        description="Request fields the server does not implement: warn = accept and log their names, "
        "refuse = 400 naming the field (docs/server.md).",
    )


class LoggingConfig(_Model):
    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["text", "json"] = "text"
    access_log: bool = False


class ServerConfig(_Model):
    model: ModelConfig
    backend: Backend = Backend.AUTO
    speculative: SpeculativeConfig = Field(default_factory=SpeculativeConfig)
    placement: PlacementConfig = Field(default_factory=PlacementConfig)
    runtime: RuntimeConfig = Field(default_factory=RuntimeConfig)
    serving: ServingConfig = Field(default_factory=ServingConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)

    @property
    def method(self) -> Method:
        if self.speculative.method is not None:
            return self.speculative.method
        return Method.DRAFT_TARGET if self.model.draft is not None else Method.NONE

    @model_validator(mode="after")
    def _method_inputs(self) -> ServerConfig:
        method = self.speculative.method
        if method == Method.DRAFT_TARGET and self.model.draft is None:
            raise ValueError("speculative.method draftTarget needs model.draft")
        if method in SPECULATIVE_MODEL_METHODS and self.model.speculative_model is None:
            raise ValueError(
                f"speculative.method {method} needs model.speculativeModel (its draft checkpoint)"
            )
        if self.model.speculative_model is not None and method not in SPECULATIVE_MODEL_METHODS:
            raise ValueError(
                "model.speculativeModel is only used by speculative.method eagle3, pard and dflash"
            )
        sa = self.speculative.suffix_automaton
        if sa is not None and method not in (Method.SUFFIX_AUTOMATON, *SA_ENHANCED_METHODS):
            raise ValueError(
                "speculative.suffixAutomaton is only for methods suffixAutomaton, eagle3, mtp, pard"
            )
        problem = method_backend_problem(self, self.backend)
        if problem is not None:
            raise ValueError(problem)
        return self

    def dump(self) -> dict[str, Any]:
        """The file form (camelCase, JSON-compatible)."""
        return self.model_dump(mode="json", by_alias=True)


def config_digest(dump: dict[str, Any]) -> str:
    """SHA-256 of a configuration in file form (`ServerConfig.dump()`), keys sorted: the identity of the
    configuration a server runs (exported as `specdeploy_server_config_info{config_sha256}`)."""
    canonical = json.dumps(dump, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()


def read_config_file(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the configuration must be a mapping")
    return data


def merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Deep merge: mappings merge key by key, anything else in ``override`` replaces."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def method_backend_problem(config: ServerConfig, backend: Backend) -> str | None:
    """Why ``backend`` cannot run the configured method (None: it can, or ``auto`` decides later)."""
    method = config.method
    if backend == Backend.AUTO:
        return None
    if method in LLMAPI_ONLY_METHODS and backend != Backend.TRTLLM_LLMAPI:
        return f"speculative.method {method.value} runs only on backend trtllm-llmapi, not {backend.value}"
    if method == Method.EAGLE3 and backend == Backend.TRTLLM_ENGINE:
        return (
            "speculative.method eagle3 runs on backend trtllm-llmapi or pytorch-reference, not trtllm-engine"
        )
    if config.speculative.suffix_automaton is not None and backend != Backend.TRTLLM_LLMAPI:
        return f"speculative.suffixAutomaton runs only on backend trtllm-llmapi, not {backend.value}"
    return None


def is_engine_dir(path: Path) -> bool:
    """A TensorRT-LLM engine directory holds config.json and rank*.engine."""
    return (path / "config.json").is_file() and any(path.glob("rank*.engine"))


def detect_backend(path: Path, method: Method | None = None) -> Backend:
    """An engine directory means trtllm-engine; a method only the LLM API runs, or eagle3 where TensorRT-LLM
    is installed, means trtllm-llmapi; any other checkpoint is served by pytorch-reference."""
    if is_engine_dir(path):
        return Backend.TRTLLM_ENGINE
    if method in LLMAPI_ONLY_METHODS:
        return Backend.TRTLLM_LLMAPI
    if method == Method.EAGLE3 and importlib.util.find_spec("tensorrt_llm") is not None:
        return Backend.TRTLLM_LLMAPI
    return Backend.PYTORCH_REFERENCE
