"""A test double of the small part of TensorRT-LLM the server calls, driven by the tiny reference models.

TensorRT-LLM cannot be installed here (PyPI only holds a placeholder that fetches the wheel from NVIDIA's own
index), so the ``trtllm_double`` fixture puts stand-in ``tensorrt_llm``, ``tensorrt_llm.bindings.executor``
and ``tensorrt_llm.llmapi`` modules into ``sys.modules``. Class, argument, field and enum names are those of
the real package, checked against its sources (docs/trtllm.md, "Fidelity"). What the double computes is
real: an ``Executor`` loads the Hugging Face checkpoint registered for its engine directory and runs it with
transformers, and ``LLM`` runs its checkpoint (and, when speculating, a drafter) the same way: outputs are the
tiny models' own.

The double rejects what the real classes reject:

* bindings (nanobind): an unknown or missing keyword raises ``TypeError``; ``DynamicBatchConfig`` has three
  required arguments; ``ModelType`` has ``DECODER_ONLY``, ``ENCODER_ONLY``, ``ENCODER_DECODER``;
  ``ExternalDraftTokensConfig`` refuses an empty token list and logits that are not 2-D with one row per draft
  token (``TLLM_CHECK``: ``RuntimeError``); the executor answers a request over ``max_input_len``,
  ``max_seq_len``, ``max_draft_len``, with a token id or draft-logits width outside its padded vocabulary, or
  asking for generation logits it does not gather, with an error ``Response``; ``cancel_request`` on a request
  already answered as final is ignored (the real one logs "Ignoring already terminated request") and after
  ``shutdown()`` raises ``RuntimeError``;
* LLM API (pydantic models and a kw-only dataclass): an unknown keyword of ``LLM`` or of a config model raises
  ``ValueError`` (pydantic's ``ValidationError`` is one), of ``SamplingParams`` ``TypeError``;
  ``max_draft_len`` must be > 0 for NGram, DraftTarget and EAGLE; DraftTarget and EAGLE need a speculative
  model; ``generate_async`` can raise ``ValueError`` before anything runs; a stream yields one output per
  executor response with cumulative ``token_ids``, several new tokens when a step accepted drafts;
  ``abort()`` ends the stream with a final output whose ``finish_reason`` is ``'cancelled'``; ``end_id`` left
  unset is filled in from the tokenizer and the checkpoint's ``generation_config.json`` adds its other
  end-of-sequence ids as stop tokens, while an explicit ``end_id`` skips that setup; ``SamplingParams``'
  penalties, ``top_k``, ``min_p`` and ``guided_decoding`` are applied and validated as in
  ``tests/server/trtllm_double_sampling.py`` (guided decoding with llguidance, as TensorRT-LLM's llguidance
  backend: the mask really constrains the model's output).

Differences from the real API that remain, and why:

1. One worker thread per executor runs requests one after another, re-running the whole prefix per token (no
   in-flight batching, no KV cache): the tests need outputs, not speed.
2. Constructors know only the keywords our code uses plus a few neighbours; a keyword the real class has but
   the double lacks fails here. Stricter, never looser.
3. ``Executor(...)`` with a model type other than ``DECODER_ONLY`` raises ``RuntimeError`` at once; the real
   one fails while loading the engine. Only decoder-only checkpoints exist here.
4. A target request with external draft tokens returns the accepted draft tokens plus one token of its own
   and finishes, as TensorRT-LLM's own draft-target loop assumes; whether the real executor instead keeps
   decoding up to ``max_tokens`` is not settled by the source, so ``STATE.continue_after_verify = True``
   makes the double do that (the server must count acceptance right either way).
5. Padded vocabulary columns of generation logits are 0 (a zero-padded ``lm_head``); sampling ignores them,
   as the real sampler does beyond ``vocab_size``. ``acceptance_threshold`` and ``fast_logits`` are accepted
   and ignored; sampled draft tokens are verified by rejection sampling, greedy ones by token match.
6. Iteration statistics: one entry per request, not per iteration; the executor reports no perf metrics.
7. The LLM runs in-process (no MPI workers, no tokenizer on the prompt: prompts are token ids). EAGLE/EAGLE-3
   ``speculative_model`` checkpoints are run as plain draft models (the tiny models have no EAGLE heads), MTP
   has no heads at all and decodes one token per step, and sampled requests verify drafts by token match
   against the target's own samples rather than by rejection sampling.
8. ``request_perf_metrics.speculative_decoding`` comes back zeroed, as in 1.2.x's PyTorch flow with the
   default sampler; ``STATE.perf_metrics_count_speculation = True`` reports the real counts (upstream PR
   #17082).
9. ``generate_async`` checks only an empty prompt, a prompt longer than ``max_num_tokens`` without chunked
   prefill, and a prompt longer than ``max_seq_len``; ``STATE.fail_when`` makes it raise ``RuntimeError``
   (TensorRT-LLM's ``RequestError``) for chosen prompts. Error messages are the double's own.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import logging
import math
import queue
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.server.trtllm_double_sampling import (
    GuideCompiler,
    GuidedDecodingParams,
    check_sampling_values,
    penalised,
    probabilities,
)

log = logging.getLogger("tensorrt_llm")


# ------------------------------------------------------------------------------------------ records
def _record(name: str, required: tuple[str, ...] = (), **defaults: Any) -> type:
    """A keyword config class of the bindings: exactly ``required`` + ``defaults``' names; anything else, or a
    missing required one, is a ``TypeError`` (nanobind's "incompatible function arguments")."""

    def __init__(self: Any, **kwargs: Any) -> None:
        unknown = set(kwargs) - set(defaults) - set(required)
        missing = [key for key in required if key not in kwargs]
        if unknown or missing:
            raise TypeError(
                f"__init__(): incompatible function arguments for {name}: "
                f"unexpected {sorted(unknown)}, missing {missing}"
            )
        for key, value in {**defaults, **kwargs}.items():
            setattr(self, key, value)

    return type(name, (), {"__init__": __init__, "__repr__": lambda self: f"{name}({vars(self)})"})


class ValidationError(ValueError):
    """What the LLM API's pydantic models raise (pydantic's ``ValidationError`` is a ``ValueError``)."""


def _model(
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


class ModelType(enum.Enum):
    DECODER_ONLY = 0
    ENCODER_ONLY = 1
    ENCODER_DECODER = 2


class CommunicationType(enum.Enum):
    MPI = 0


class CommunicationMode(enum.Enum):
    LEADER = 0
    ORCHESTRATOR = 1


class CapacitySchedulerPolicy(enum.Enum):
    MAX_UTILIZATION = 0
    GUARANTEED_NO_EVICT = 1
    STATIC_BATCH = 2


class FinishReason(enum.Enum):
    NOT_FINISHED = 0
    END_ID = 1
    STOP_WORDS = 2
    LENGTH = 3
    TIMED_OUT = 4
    CANCELLED = 5


KvCacheConfig = _record(
    "KvCacheConfig",
    enable_block_reuse=True,
    max_tokens=None,
    max_attention_window=None,
    sink_token_length=None,
    free_gpu_memory_fraction=None,
    host_cache_size=None,
    onboard_blocks=True,
    cross_kv_cache_fraction=None,
    secondary_offload_min_priority=None,
    event_buffer_max_size=0,
)
DynamicBatchConfig = _record(
    "DynamicBatchConfig",
    required=(
        "enable_batch_size_tuning",
        "enable_max_num_tokens_tuning",
        "dynamic_batch_moving_average_window",
    ),
)
SchedulerConfig = _record(
    "SchedulerConfig",
    capacity_scheduler_policy=CapacitySchedulerPolicy.GUARANTEED_NO_EVICT,
    context_chunking_policy=None,
    dynamic_batch_config=None,
)
OrchestratorConfig = _record(
    "OrchestratorConfig",
    is_orchestrator=True,
    worker_executable_path="",
    orch_leader_comm=None,
    spawn_processes=True,
)
ParallelConfig = _record(
    "ParallelConfig",
    communication_type=CommunicationType.MPI,
    communication_mode=CommunicationMode.LEADER,
    device_ids=None,
    participant_ids=None,
    orchestrator_config=None,
    num_nodes=None,
)
ExecutorConfig = _record(
    "ExecutorConfig",
    max_beam_width=1,
    scheduler_config=None,
    kv_cache_config=None,
    enable_chunked_context=False,
    iter_stats_max_iterations=1000,
    max_batch_size=None,
    max_num_tokens=None,
    parallel_config=None,
    max_queue_size=None,
    gather_generation_logits=False,
)
OutputConfig = _record(
    "OutputConfig",
    return_log_probs=False,
    return_context_logits=False,
    return_generation_logits=False,
    exclude_input_from_output=False,
    return_encoder_output=False,
    return_perf_metrics=False,
)


class SamplingConfig:
    def __init__(
        self,
        beam_width: int = 1,
        *,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | None = None,
        temperature: float | None = None,
    ) -> None:
        self.beam_width, self.top_k, self.top_p, self.seed, self.temperature = (
            beam_width,
            top_k,
            top_p,
            seed,
            temperature,
        )


class ExternalDraftTokensConfig:
    """Draft tokens (and optionally their logits, ``[num_tokens, vocab]``) for the target to verify."""

    def __init__(
        self,
        tokens: list[int],
        logits: Any = None,
        acceptance_threshold: float | None = None,
        fast_logits: bool | None = None,
    ) -> None:
        tokens = list(tokens)
        if not tokens:
            raise RuntimeError("[TensorRT-LLM][ERROR] Assertion failed: !mTokens.empty()")
        if logits is not None:
            shape = tuple(logits.shape)
            if len(shape) != 2 or shape[0] != len(tokens):
                raise RuntimeError(
                    f"[TensorRT-LLM][ERROR] Assertion failed: draft logits must be [numDraftTokens, vocab] = "
                    f"[{len(tokens)}, vocab], got {list(shape)}"
                )
        self.tokens, self.logits = tokens, logits
        self.acceptance_threshold, self.fast_logits = acceptance_threshold, fast_logits


class Request:
    def __init__(
        self,
        input_token_ids: list[int],
        max_tokens: int,
        *,
        streaming: bool = False,
        sampling_config: SamplingConfig | None = None,
        output_config: Any = None,
        end_id: int | None = None,
        pad_id: int | None = None,
        external_draft_tokens_config: ExternalDraftTokensConfig | None = None,
    ) -> None:
        self.input_token_ids = list(input_token_ids)
        self.max_tokens = max_tokens
        self.streaming = streaming
        self.sampling_config = sampling_config or SamplingConfig()
        self.output_config = output_config or OutputConfig()
        self.end_id = end_id
        self.pad_id = pad_id
        self.external_draft_tokens_config = external_draft_tokens_config


@dataclass
class Result:
    is_final: bool
    output_token_ids: list[list[int]]
    finish_reasons: list[FinishReason]
    generation_logits: Any = None


class Response:
    def __init__(self, request_id: int, result: Result | None = None, error_msg: str = "") -> None:
        self.request_id, self.result, self.error_msg = request_id, result, error_msg

    def has_error(self) -> bool:
        return self.result is None


KvCacheStats = _record(
    "KvCacheStats", max_num_blocks=0, free_num_blocks=0, used_num_blocks=0, tokens_per_block=0
)
IterationStats = _record(
    "IterationStats",
    iter=0,
    iter_latency_ms=0.0,
    num_active_requests=0,
    num_queued_requests=0,
    kv_cache_stats=None,
)


# ------------------------------------------------------------------------------------------ the executor
@dataclass
class DoubleState:
    """What the double was given and what it did, for the tests to inspect and steer."""

    checkpoints: dict[Path, Path] = field(default_factory=dict)  # engine dir -> HF checkpoint it stands for
    executors: list[Executor] = field(default_factory=list)
    llms: list[LLM] = field(default_factory=list)
    cancelled: list[int] = field(default_factory=list)  # cancel_request calls on requests in flight
    cancelled_in_flight: list[int] = field(default_factory=list)  # requests that ended CANCELLED
    ignored_cancels: list[int] = field(default_factory=list)  # cancel_request on already terminated requests
    #: request -> error message (the executor answers with an error Response instead of running it)
    fail_when: Callable[[Request], str | None] | None = None
    request_delay: float = 0.0  # seconds each request (executor) / response (LLM) takes at least
    #: a target request with draft tokens keeps decoding up to max_tokens after the verified part
    continue_after_verify: bool = False
    #: request_perf_metrics.speculative_decoding carries real counts (False: zeroed, as in 1.2.x)
    perf_metrics_count_speculation: bool = False


STATE = DoubleState()


def _probs(logits: torch.Tensor, temperature: float | None, top_p: float | None) -> torch.Tensor:
    probs = torch.softmax(logits.double() / (temperature or 1.0), dim=-1)
    if top_p is not None and top_p < 1.0:
        sorted_p, order = torch.sort(probs, descending=True)
        keep = (torch.cumsum(sorted_p, 0) - sorted_p) < top_p
        mask = torch.zeros_like(probs, dtype=torch.bool)
        mask[order[keep]] = True
        probs = torch.where(mask, probs, torch.zeros_like(probs))
        probs = probs / probs.sum()
    return probs


def padded_vocab(vocab_size: int, world_size: int) -> int:
    """TensorRT-LLM's ``ModelConfig::getVocabSizePadded(worldSize)``: the vocabulary rounded up to a multiple
    of the engine's world size (tp x pp); generation logits are this wide."""
    return math.ceil(vocab_size / world_size) * world_size


class Executor:
    def __init__(self, model_path: Path, model_type: ModelType, executor_config: Any) -> None:
        if not isinstance(model_type, ModelType):
            raise TypeError(f"__init__(): incompatible function arguments: model_type {model_type!r}")
        if model_type is not ModelType.DECODER_ONLY:
            raise RuntimeError(f"{model_type.name} is not supported by this decoder-only engine")
        self.path = Path(model_path)
        self.config = executor_config
        engine = json.loads((self.path / "config.json").read_text())
        build, mapping = engine["build_config"], engine["pretrained_config"]["mapping"]
        world = mapping["tp_size"] * mapping.get("pp_size", 1)
        device_ids = executor_config.parallel_config.device_ids
        if device_ids is not None and len(device_ids) != world:
            raise RuntimeError(f"the engine needs {world} devices, got device_ids {device_ids}")
        self.max_input_len, self.max_seq_len = build["max_input_len"], build["max_seq_len"]
        self.max_draft_len = build.get("max_draft_len", 0)
        self.tokens_per_block = build["plugin_config"]["tokens_per_block"]
        self.vocab_size = int(engine["pretrained_config"]["vocab_size"])
        self.vocab_size_padded = padded_vocab(self.vocab_size, world)
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(STATE.checkpoints[self.path]), local_files_only=True
        )
        self.model: Any = model.eval()
        self._queue: queue.Queue[tuple[int, Request] | None] = queue.Queue()
        self._responses: list[Response] = []
        self._stats: list[Any] = []
        self._ready = threading.Condition()
        self._cancel: set[int] = set()
        self._terminated: set[int] = set()
        self._next_id = 1
        self._shut = False
        self._thread = threading.Thread(target=self._work, daemon=True)
        self._thread.start()
        STATE.executors.append(self)

    # the bindings' surface
    def enqueue_requests(self, requests: list[Request]) -> list[int]:
        return [self.enqueue_request(r) for r in requests]

    def enqueue_request(self, request: Request) -> int:
        if self._shut:
            raise RuntimeError("Shutdown called")
        request_id, self._next_id = self._next_id, self._next_id + 1
        self._queue.put((request_id, request))
        return request_id

    def await_responses(self, timeout: Any = None) -> list[Response]:
        if self._shut:
            raise RuntimeError("Shutdown called")
        with self._ready:
            if not self._responses:
                self._ready.wait(None if timeout is None else timeout.total_seconds())
            out, self._responses = self._responses, []
        return out

    def cancel_request(self, id: int) -> None:
        if self._shut:
            raise RuntimeError("Shutdown called")
        if id in self._terminated:
            log.info("Ignoring already terminated request %d", id)
            STATE.ignored_cancels.append(id)
            return
        STATE.cancelled.append(id)
        self._cancel.add(id)

    def get_latest_iteration_stats(self) -> list[Any]:
        out, self._stats = self._stats, []
        return out

    def shutdown(self) -> None:
        self._shut = True
        self._queue.put(None)
        self._thread.join(timeout=10)

    # inside
    def _respond(self, response: Response) -> None:
        with self._ready:
            self._terminated.add(response.request_id)
            self._responses.append(response)
            self._ready.notify_all()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            request_id, request = item
            started = time.perf_counter()
            while time.perf_counter() - started < STATE.request_delay and request_id not in self._cancel:
                time.sleep(0.002)
            if request_id in self._cancel:
                STATE.cancelled_in_flight.append(request_id)
                self._respond(Response(request_id, Result(True, [[]], [FinishReason.CANCELLED])))
                continue
            problem = self._refuse(request) or (STATE.fail_when(request) if STATE.fail_when else None)
            if problem is not None:
                self._respond(Response(request_id, error_msg=problem))
                continue
            self._respond(Response(request_id, self._run(request)))
            used = math.ceil(len(request.input_token_ids) / self.tokens_per_block)
            total = (self.config.max_batch_size or 1) * math.ceil(self.max_seq_len / self.tokens_per_block)
            self._stats.append(
                IterationStats(
                    iter_latency_ms=(time.perf_counter() - started) * 1000.0,
                    num_active_requests=1,
                    num_queued_requests=self._queue.qsize(),
                    kv_cache_stats=KvCacheStats(
                        max_num_blocks=total, used_num_blocks=used, free_num_blocks=total - used
                    ),
                )
            )

    def _refuse(self, request: Request) -> str | None:
        n = len(request.input_token_ids)
        draft = request.external_draft_tokens_config
        if n > self.max_input_len:
            return f"input length ({n}) exceeds the engine's max_input_len ({self.max_input_len})"
        if n + request.max_tokens > self.max_seq_len:
            return f"input ({n}) + max_tokens ({request.max_tokens}) exceeds max_seq_len ({self.max_seq_len})"
        if any(not 0 <= t < self.vocab_size_padded for t in request.input_token_ids):
            return f"input token id out of range [0, {self.vocab_size_padded})"
        if draft is not None and len(draft.tokens) > self.max_draft_len:
            return f"draft tokens ({len(draft.tokens)}) exceeds maximum draft length ({self.max_draft_len})"
        if draft is not None and draft.logits is not None and draft.logits.shape[1] != self.vocab_size_padded:
            return (
                f"draft logits vocab size ({draft.logits.shape[1]}) does not match the engine's padded "
                f"vocab size ({self.vocab_size_padded})"
            )
        if request.output_config.return_generation_logits and not self.config.gather_generation_logits:
            return "generation logits requested but gather_generation_logits is off"
        return None

    def _row(self, logits: torch.Tensor) -> torch.Tensor:
        """One logits row as the engine's output layer would produce it: ``vocab_size_padded`` wide."""
        row = logits[: self.vocab_size]
        return torch.nn.functional.pad(row, (0, self.vocab_size_padded - row.shape[0]))

    @torch.inference_mode()
    def _run(self, request: Request) -> Result:
        sc = request.sampling_config
        greedy = sc.top_k == 1
        generator = torch.Generator().manual_seed(sc.seed) if sc.seed is not None else None
        vocab = self.vocab_size

        def pick(row: torch.Tensor) -> int:  # the sampler ignores the padded columns
            if greedy:
                return int(row[:vocab].argmax())
            probs = _probs(row[:vocab], sc.temperature, sc.top_p)
            return int(torch.multinomial(probs, 1, generator=generator))

        ids = list(request.input_token_ids)
        out: list[int] = []
        rows: list[torch.Tensor] = []
        draft = request.external_draft_tokens_config
        if draft is not None:
            logits = self.model(torch.tensor([ids + draft.tokens])).logits[0, len(ids) - 1 :].float()
            for i, token in enumerate(draft.tokens):
                if draft.logits is not None and not greedy:  # rejection sampling against the draft's logits
                    p = _probs(logits[i][:vocab], sc.temperature, sc.top_p)
                    q = _probs(draft.logits[i][:vocab].float(), sc.temperature, sc.top_p)
                    u = float(torch.rand(1, generator=generator))
                    if u * float(q[token]) < float(p[token]):
                        out.append(token)
                        continue
                    residual = torch.clamp(p - q, min=0)
                    out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
                    break
                own = pick(logits[i])
                out.append(own)
                if own != token:
                    break
            else:
                out.append(pick(logits[len(draft.tokens)]))
        if draft is None or STATE.continue_after_verify:
            while len(out) < request.max_tokens and request.end_id not in out:
                row = self._row(self.model(torch.tensor([ids + out])).logits[0, -1].float())
                rows.append(row)
                out.append(pick(row))
        finish = FinishReason.LENGTH
        if request.end_id in out:
            out = out[: out.index(request.end_id) + 1]
            finish = FinishReason.END_ID
        out = out[: request.max_tokens]
        logits_out = (
            torch.stack(rows[: len(out)]).unsqueeze(0)
            if request.output_config.return_generation_logits and rows
            else None
        )
        tokens = out if request.output_config.exclude_input_from_output else ids + out
        return Result(True, [tokens], [finish], logits_out)


# ------------------------------------------------------------------------------------------ the LLM API
#: DecodingBaseConfig's load-aware fields, in every decoding config: max_concurrency (PositiveInt: off above
#: that many active requests), acceptance_rate_window_size (NonNegativeInt), acceptance_rate_threshold (0..1)
_LOAD_AWARE = {
    "max_concurrency": None,
    "acceptance_rate_window_size": None,
    "acceptance_rate_threshold": None,
}


def _base_fields(config: Any) -> str | None:
    concurrency, window = config.max_concurrency, config.acceptance_rate_window_size
    threshold = config.acceptance_rate_threshold
    if concurrency is not None and (not isinstance(concurrency, int) or concurrency <= 0):
        return f"max_concurrency: Input should be greater than 0, got {concurrency}"
    if window is not None and (not isinstance(window, int) or window < 0):
        return f"acceptance_rate_window_size: Input should be greater than or equal to 0, got {window}"
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        return f"acceptance_rate_threshold: Input should be between 0 and 1, got {threshold}"
    return None


def _needs_draft_len(config: Any) -> str | None:
    if config.max_draft_len is None or config.max_draft_len <= 0:
        return f"max_draft_len must be > 0, got {config.max_draft_len}"
    return _base_fields(config)


def _needs_model(config: Any) -> str | None:
    if config.speculative_model is None:
        return "a speculative model (speculative_model) is required"
    return _needs_draft_len(config)


LlmKvCacheConfig = _model("KvCacheConfig", enable_block_reuse=True, free_gpu_memory_fraction=None)
LlmSchedulerConfig = _model(
    "SchedulerConfig", capacity_scheduler_policy=CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
)
_MODEL_ALIAS = {"speculative_model_dir": "speculative_model"}
EagleDecodingConfig = _model(
    "EagleDecodingConfig",
    **_LOAD_AWARE,
    aliases=_MODEL_ALIAS,
    check=_needs_model,
    max_draft_len=None,
    speculative_model=None,
    eagle3_one_model=True,
)
Eagle3DecodingConfig = _model(
    "Eagle3DecodingConfig",
    **_LOAD_AWARE,
    aliases=_MODEL_ALIAS,
    check=_needs_model,
    max_draft_len=None,
    speculative_model=None,
    eagle3_one_model=True,
)
NGramDecodingConfig = _model(
    "NGramDecodingConfig",
    **_LOAD_AWARE,
    check=_needs_draft_len,
    max_draft_len=None,
    max_matching_ngram_size=2,
    is_keep_all=True,
    is_use_oldest=True,
    is_public_pool=True,
)
DraftTargetDecodingConfig = _model(
    "DraftTargetDecodingConfig",
    **_LOAD_AWARE,
    aliases=_MODEL_ALIAS,
    check=_needs_model,
    max_draft_len=None,
    speculative_model=None,
)
MTPDecodingConfig = _model(
    "MTPDecodingConfig", check=_base_fields, num_nextn_predict_layers=1, max_draft_len=None, **_LOAD_AWARE
)
#: decoding_type AUTO: TensorRT-LLM's NGram heuristic (<= 4 active requests K=5/n=3, <= 32 K=3/n=5, above
#: that off); the base-class fields exist but are ignored
AutoDecodingConfig = _model("AutoDecodingConfig", check=_base_fields, max_draft_len=None, **_LOAD_AWARE)
#: (draft length, longest n-gram) of the AUTO heuristic by active requests; None above the last bound
AUTO_NGRAM_SCHEDULE = ((4, 5, 3), (32, 3, 5))


@dataclass(kw_only=True)
class SamplingParams:
    """The fields of ``tensorrt_llm.SamplingParams`` our code may use (a kw-only dataclass there too)."""

    end_id: int | None = None
    pad_id: int | None = None
    max_tokens: int = 32
    stop_token_ids: list[int] | None = None
    include_stop_str_in_output: bool = False
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    temperature: float | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    return_perf_metrics: bool = False
    exclude_input_from_output: bool = True
    detokenize: bool = True
    guided_decoding: GuidedDecodingParams | None = None

    def __post_init__(self) -> None:
        if self.pad_id is None:
            self.pad_id = self.end_id
        if self.guided_decoding is not None:
            self.guided_decoding._validate()


@dataclass
class SpeculativeDecodingMetrics:
    acceptance_rate: float = 0.0
    total_accepted_draft_tokens: int = 0
    total_draft_tokens: int = 0


@dataclass
class RequestPerfMetrics:
    speculative_decoding: SpeculativeDecodingMetrics = field(default_factory=SpeculativeDecodingMetrics)


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    request_perf_metrics: RequestPerfMetrics | None = None
    _last_token_ids_len: int = 0

    @property
    def token_ids_diff(self) -> list[int]:
        return self.token_ids[self._last_token_ids_len :]


class RequestOutput:
    """``GenerationResult``: one executor response per iteration of ``async for``, the same object each time
    with cumulative ``token_ids``."""

    def __init__(
        self, llm: LLM, prompt: list[int], params: SamplingParams, stop_words: set[int], matcher: Any
    ) -> None:
        self.llm, self.prompt_token_ids, self.params = llm, prompt, params
        self.matcher = matcher  # the request's grammar state (guided decoding), or None
        self._stop_words = stop_words  # stop_token_ids + the generation config's extra end ids
        self._outputs = [CompletionOutput(0)]
        self._done = False
        self._aborted = False
        self.responses = 0
        self.drafted = 0  # what the double really drafted and accepted, for the tests
        self.accepted = 0

    @property
    def outputs(self) -> list[CompletionOutput]:
        return self._outputs

    @property
    def finished(self) -> bool:
        return self._done

    def abort(self) -> None:
        self._aborted = True

    def aborted(self) -> bool:
        return self._aborted

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        await asyncio.sleep(STATE.request_delay)
        out = self._outputs[0]
        out._last_token_ids_len = len(out.token_ids)
        self.responses += 1
        if self._aborted:  # the executor answers the cancelled request with a final, empty response
            out.finish_reason = "cancelled"
            self._finish(out)
            return self
        room = self.params.max_tokens - len(out.token_ids)
        first = not out.token_ids
        tokens, drafted, accepted = await asyncio.to_thread(
            self.llm.step,
            self.prompt_token_ids,
            out.token_ids,
            self.params,
            room,
            first=first,
            matcher=self.matcher,
        )
        self.drafted += drafted
        self.accepted += accepted
        end = self.params.end_id
        for i, token in enumerate(tokens):
            if token == end or token in self._stop_words:
                keep = token == end or self.params.include_stop_str_in_output
                out.token_ids.extend(tokens[: i + 1] if keep else tokens[:i])
                out.finish_reason = "stop"
                out.stop_reason = None if token == end else token
                self._finish(out)
                return self
        out.token_ids.extend(tokens)
        if len(out.token_ids) >= self.params.max_tokens:
            out.finish_reason = "length"
            self._finish(out)
        return self

    def _finish(self, out: CompletionOutput) -> None:
        self._done = True
        if self.params.return_perf_metrics:
            real = STATE.perf_metrics_count_speculation
            drafted, accepted = (self.drafted, self.accepted) if real else (0, 0)
            out.request_perf_metrics = RequestPerfMetrics(
                SpeculativeDecodingMetrics(accepted / drafted if drafted else 0.0, accepted, drafted)
            )


_LLM_ARGS = frozenset(
    {
        "tokenizer",
        "tensor_parallel_size",
        "pipeline_parallel_size",
        "max_batch_size",
        "max_num_tokens",
        "max_seq_len",
        "kv_cache_config",
        "scheduler_config",
        "enable_chunked_prefill",
        "speculative_config",
        "disable_overlap_scheduler",
        "return_perf_metrics",
        "enable_iter_perf_stats",
        "guided_decoding_backend",
    }
)
GUIDED_DECODING_BACKENDS = (None, "xgrammar", "llguidance")


class LLM:
    def __init__(self, model: str, tokenizer: str | None = None, **kwargs: Any) -> None:
        unknown = set(kwargs) - _LLM_ARGS
        if unknown:
            raise ValidationError(f"1 validation error for TorchLlmArgs: {sorted(unknown)} not permitted")
        backend = kwargs.get("guided_decoding_backend")
        if backend not in GUIDED_DECODING_BACKENDS:
            raise ValueError(f"Unsupported guided decoding backend {backend}")
        self.kwargs: dict[str, Any] = {"model": model, "tokenizer": tokenizer, **kwargs}
        loaded: Any = AutoModelForCausalLM.from_pretrained(model, local_files_only=True)
        self.model: Any = loaded.eval()
        tok: Any = AutoTokenizer.from_pretrained(tokenizer or model, local_files_only=True)
        self.eos_token_id: int | None = tok.eos_token_id
        # llguidance only: the double does not model xgrammar (a guided request fails, see generate_async)
        self.guides = (
            GuideCompiler(tok, int(loaded.config.vocab_size), tok.eos_token_id)
            if backend == "llguidance"
            else None
        )
        self.pad_token_id: int | None = tok.pad_token_id
        generation = Path(model) / "generation_config.json"
        extra = json.loads(generation.read_text()).get("eos_token_id") if generation.is_file() else None
        self.generation_eos: set[int] = set(
            extra if isinstance(extra, list) else [] if extra is None else [extra]
        )
        self.spec = cast(Any, kwargs.get("speculative_config"))
        self.draft_model: Any = None
        kind = type(self.spec).__name__
        if kind in ("DraftTargetDecodingConfig", "EagleDecodingConfig", "Eagle3DecodingConfig"):
            draft: Any = AutoModelForCausalLM.from_pretrained(
                self.spec.speculative_model, local_files_only=True
            )
            self.draft_model = draft.eval()
        self.requests: list[RequestOutput] = []
        self.shut = False
        STATE.llms.append(self)

    def generate_async(
        self,
        inputs: list[int],
        sampling_params: SamplingParams | None = None,
        lora_request: Any = None,
        prompt_adapter_request: Any = None,
        streaming: bool = False,
    ) -> RequestOutput:
        if self.shut:
            raise RuntimeError("LLM is shut down")
        prompt = list(inputs)
        if not prompt:
            raise ValueError("The inputs must not be empty")
        max_num_tokens = self.kwargs.get("max_num_tokens")
        if (
            max_num_tokens is not None
            and len(prompt) > max_num_tokens
            and not self.kwargs.get("enable_chunked_prefill")
        ):
            raise ValueError(
                f"The prompt length ({len(prompt)}) should not exceed max_num_tokens ({max_num_tokens})"
            )
        max_seq_len = self.kwargs.get("max_seq_len")
        if max_seq_len is not None and len(prompt) > max_seq_len:
            raise ValueError(
                f"The prompt length ({len(prompt)}) should not exceed max_seq_len ({max_seq_len})"
            )
        params = dataclasses.replace(sampling_params) if sampling_params is not None else SamplingParams()
        stop_words = set(params.stop_token_ids or ())
        if params.end_id is None:  # SamplingParams._setup: only when the caller left end_id unset
            params.end_id = self.eos_token_id
            params.pad_id = self.pad_token_id if self.pad_token_id is not None else params.end_id
            stop_words |= self.generation_eos - {params.end_id}
        check_sampling_values(params)
        matcher = None
        if params.guided_decoding is not None:
            if self.guides is None:  # no GuidedDecoder without a backend (xgrammar: not modelled)
                raise ValueError("guided decoding needs guided_decoding_backend='llguidance' in the double")
            matcher = self.guides.matcher(params.guided_decoding)
        problem = STATE.fail_when(Request(prompt, params.max_tokens)) if STATE.fail_when else None
        if problem is not None:
            raise RuntimeError(problem)
        output = RequestOutput(self, prompt, params, stop_words, matcher)
        self.requests.append(output)
        return output

    # inside ----------------------------------------------------------------------------------------
    def _pick(
        self, row: torch.Tensor, params: SamplingParams, prompt: list[int], output: list[int], matcher: Any
    ) -> int:
        """The target's token at one position: penalties, the grammar's mask, then greedy or sampling."""
        x = penalised(row, params, prompt, output)
        if matcher is not None:
            assert self.guides is not None
            x[~self.guides.allowed(matcher, x.numel())] = -math.inf
        greedy = params.top_k == 1
        token = int(x.argmax()) if greedy else int(torch.multinomial(probabilities(x, params), 1))
        if matcher is not None and token != params.end_id and not matcher.is_stopped():
            matcher.consume_token(token)
        return token

    def _draft(self, ids: list[int]) -> list[int]:
        spec, kind = self.spec, type(self.spec).__name__
        active = sum(1 for r in self.requests if not r.finished)
        if getattr(spec, "max_concurrency", None) is not None and active > spec.max_concurrency:
            return []  # speculation is off above max_concurrency active requests
        if self.draft_model is not None:
            out: list[int] = []
            for _ in range(spec.max_draft_len):
                out.append(int(self.draft_model(torch.tensor([ids + out])).logits[0, -1].argmax()))
            return out
        if kind == "NGramDecodingConfig":
            return self._ngram(ids, spec.max_draft_len, spec.max_matching_ngram_size)
        if kind == "AutoDecodingConfig":
            for bound, k, n in AUTO_NGRAM_SCHEDULE:
                if active <= bound:
                    return self._ngram(ids, k, n)
        return []

    @staticmethod
    def _ngram(ids: list[int], k: int, max_n: int) -> list[int]:
        for n in range(min(max_n, len(ids) - 1), 0, -1):
            tail = ids[-n:]
            for start in range(len(ids) - n):  # the oldest match
                if ids[start : start + n] == tail:
                    return ids[start + n : start + n + k]
        return []

    @torch.inference_mode()
    def step(
        self,
        prompt: list[int],
        output: list[int],
        params: SamplingParams,
        room: int,
        *,
        first: bool,
        matcher: Any = None,
    ) -> tuple[list[int], int, int]:
        """One iteration of one request: (new tokens, drafted, accepted). The context step yields one
        token; a generation step verifies the drafter's tokens and yields the accepted ones + one. Each
        position is picked from the target's logits there, penalised and masked by the grammar state after
        the tokens before it (the matcher consumes each picked token)."""
        ids = prompt + output
        draft = [] if first else self._draft(ids)
        logits = self.model(torch.tensor([ids + draft])).logits[0, len(ids) - 1 :].float()
        out: list[int] = []
        for i, token in enumerate(draft):
            own = self._pick(logits[i], params, prompt, output + out, matcher)
            out.append(own)
            if own != token or own == params.end_id:
                break
        else:
            out.append(self._pick(logits[len(draft)], params, prompt, output + out, matcher))
        out = out[:room]  # accepted tokens past max_tokens are not output, nor counted
        return out, len(draft), len(out) - 1 if draft else 0

    def shutdown(self) -> None:
        self.shut = True


# ------------------------------------------------------------------------------------------ installing
def _module(name: str, file: str | None = None, **members: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in members.items():
        setattr(module, key, value)
    if file is not None:
        module.__file__ = file
    return module


@pytest.fixture
def trtllm_double(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[DoubleState]:
    """Install the double as ``tensorrt_llm`` for one test; yields its state."""
    global STATE  # noqa: PLW0603 (the double's classes read the state of the test that installed them)
    STATE = DoubleState()
    executor = _module(
        "tensorrt_llm.bindings.executor",
        Executor=Executor,
        ModelType=ModelType,
        ExecutorConfig=ExecutorConfig,
        KvCacheConfig=KvCacheConfig,
        SchedulerConfig=SchedulerConfig,
        DynamicBatchConfig=DynamicBatchConfig,
        CapacitySchedulerPolicy=CapacitySchedulerPolicy,
        ParallelConfig=ParallelConfig,
        OrchestratorConfig=OrchestratorConfig,
        CommunicationType=CommunicationType,
        CommunicationMode=CommunicationMode,
        Request=Request,
        SamplingConfig=SamplingConfig,
        OutputConfig=OutputConfig,
        ExternalDraftTokensConfig=ExternalDraftTokensConfig,
        FinishReason=FinishReason,
    )
    llmapi = _module(
        "tensorrt_llm.llmapi",
        LLM=LLM,
        KvCacheConfig=LlmKvCacheConfig,
        SchedulerConfig=LlmSchedulerConfig,
        CapacitySchedulerPolicy=CapacitySchedulerPolicy,
        EagleDecodingConfig=EagleDecodingConfig,
        Eagle3DecodingConfig=Eagle3DecodingConfig,
        NGramDecodingConfig=NGramDecodingConfig,
        DraftTargetDecodingConfig=DraftTargetDecodingConfig,
        MTPDecodingConfig=MTPDecodingConfig,
        AutoDecodingConfig=AutoDecodingConfig,
        SamplingParams=SamplingParams,
        GuidedDecodingParams=GuidedDecodingParams,
    )
    bindings = _module("tensorrt_llm.bindings", executor=executor)
    root = _module(
        "tensorrt_llm",
        str(tmp_path / "tensorrt_llm" / "__init__.py"),
        LLM=LLM,
        SamplingParams=SamplingParams,
        bindings=bindings,
        llmapi=llmapi,
    )
    for name, module in (
        ("tensorrt_llm", root),
        ("tensorrt_llm.bindings", bindings),
        ("tensorrt_llm.bindings.executor", executor),
        ("tensorrt_llm.llmapi", llmapi),
    ):
        monkeypatch.setitem(sys.modules, name, module)
    yield STATE
    for ex in STATE.executors:
        if not ex._shut:
            ex.shutdown()


# ------------------------------------------------------------------------------------------ engine dirs
def write_engine(
    directory: Path,
    checkpoint: Path,
    state: DoubleState,
    *,
    tp_size: int = 1,
    pp_size: int = 1,
    speculative_decoding_mode: int = 2,
    max_draft_len: int = 10,
    gather_generation_logits: bool = False,
    use_paged_context_fmha: bool = True,
    max_input_len: int = 200,
    max_seq_len: int = 256,
    max_batch_size: int = 16,
    vocab_size: int | None = None,
) -> Path:
    """An engine directory in trtllm-build's layout (config.json, rank*.engine, tokenizer/) standing for
    ``checkpoint``; ``state`` (the double) runs the checkpoint when an Executor opens the directory."""
    hf = json.loads((checkpoint / "config.json").read_text())
    directory.mkdir(parents=True)
    config = {
        "version": "0.21.0",
        "pretrained_config": {
            "architecture": "LlamaForCausalLM",
            "dtype": "float32",
            "vocab_size": vocab_size if vocab_size is not None else hf["vocab_size"],
            "hidden_size": hf["hidden_size"],
            "num_hidden_layers": hf["num_hidden_layers"],
            "num_attention_heads": hf["num_attention_heads"],
            "num_key_value_heads": hf["num_key_value_heads"],
            "max_position_embeddings": hf["max_position_embeddings"],
            "mapping": {
                "world_size": tp_size * pp_size,
                "tp_size": tp_size,
                "pp_size": pp_size,
                "gpus_per_node": 8,
            },
            "quantization": {"quant_algo": None, "kv_cache_quant_algo": None},
        },
        "build_config": {
            "max_input_len": max_input_len,
            "max_seq_len": max_seq_len,
            "max_batch_size": max_batch_size,
            "max_beam_width": 1,
            "max_num_tokens": 8192,
            "max_draft_len": max_draft_len,
            "speculative_decoding_mode": speculative_decoding_mode,
            "gather_context_logits": False,
            "gather_generation_logits": gather_generation_logits,
            "kv_cache_type": "PAGED",
            "plugin_config": {
                "gpt_attention_plugin": "auto",
                "gemm_plugin": None,
                "use_paged_context_fmha": use_paged_context_fmha,
                "paged_kv_cache": True,
                "tokens_per_block": 32,
                "remove_input_padding": True,
                "context_fmha": True,
            },
        },
    }
    (directory / "config.json").write_text(json.dumps(config, indent=2))
    for rank in range(tp_size * pp_size):
        (directory / f"rank{rank}.engine").write_bytes(b"serialized engine stands here")
    tokenizer = directory / "tokenizer"
    tokenizer.mkdir()
    for item in checkpoint.iterdir():
        if item.is_file() and ("token" in item.name or item.name == "generation_config.json"):
            (tokenizer / item.name).write_bytes(item.read_bytes())
    state.checkpoints[directory] = checkpoint
    return directory
