"""The double of TensorRT-LLM's executor bindings (``tensorrt_llm.bindings.executor``): keyword config
records as strict as nanobind's, ``Request``/``Response``/``Result``, and an ``Executor`` whose worker thread
runs the Hugging Face checkpoint registered for its engine directory (see tests/server/trtllm_double.py for
what it rejects and how it differs from the real one)."""

from __future__ import annotations

import enum
import json
import logging
import math
import queue
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM

from tests.server.trtllm_double_state import current_state

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
            str(current_state().checkpoints[self.path]), local_files_only=True
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
        current_state().executors.append(self)

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
            current_state().ignored_cancels.append(id)
            return
        current_state().cancelled.append(id)
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
            state = current_state()
            started = time.perf_counter()
            while time.perf_counter() - started < state.request_delay and request_id not in self._cancel:
                time.sleep(0.002)
            if request_id in self._cancel:
                state.cancelled_in_flight.append(request_id)
                self._respond(Response(request_id, Result(True, [[]], [FinishReason.CANCELLED])))
                continue
            problem = self._refuse(request) or (state.fail_when(request) if state.fail_when else None)
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
        if draft is None or current_state().continue_after_verify:
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
