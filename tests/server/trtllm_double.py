"""A test double of the small part of TensorRT-LLM the server calls, driven by the tiny reference models.

TensorRT-LLM cannot be installed here (it needs an NVIDIA GPU and its wheels), so ``install_double`` puts
stand-in ``tensorrt_llm``, ``tensorrt_llm.bindings.executor`` and ``tensorrt_llm.llmapi`` modules into
``sys.modules``. Class, argument and field names are those of the real bindings (checked against the
sources, see docs/trtllm.md); constructors accept only those keyword names, so a misspelt argument fails here
as it would there. What the double computes is real: an ``Executor`` loads the Hugging Face checkpoint
registered for its engine directory and runs it with transformers: outputs are the tiny model's own. It
enforces the limits the real executor enforces (max_input_len, max_seq_len, max_draft_len, generation logits
only when gathered) and reports errors the way the real one does (a Response with ``has_error()``).
"""

from __future__ import annotations

import enum
import json
import math
import queue
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM


# ------------------------------------------------------------------------------------------ records
def _record(name: str, **defaults: Any) -> type:
    """A keyword-only config class accepting exactly ``defaults``' names (as the bindings' kwargs do)."""

    def __init__(self: Any, **kwargs: Any) -> None:
        unknown = set(kwargs) - set(defaults)
        if unknown:
            raise TypeError(f"{name}() got unexpected keyword arguments {sorted(unknown)}")
        for key, value in {**defaults, **kwargs}.items():
            setattr(self, key, value)

    return type(name, (), {"__init__": __init__, "__repr__": lambda self: f"{name}({vars(self)})"})


class ModelType(enum.Enum):
    DECODER_ONLY = 0
    ENCODER_DECODER = 1


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
    enable_batch_size_tuning=False,
    enable_max_num_tokens_tuning=False,
    dynamic_batch_moving_average_window=128,
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
    def __init__(
        self,
        tokens: list[int],
        logits: Any = None,
        acceptance_threshold: float | None = None,
        fast_logits: bool | None = None,
    ) -> None:
        self.tokens, self.logits = list(tokens), logits


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
    cancelled: list[int] = field(default_factory=list)
    #: request -> error message (the executor answers with an error Response instead of running it)
    fail_when: Callable[[Request], str | None] | None = None
    request_delay: float = 0.0  # seconds each request takes at least (so it can be cancelled in flight)


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


class Executor:
    def __init__(self, model_path: Path, model_type: ModelType, executor_config: Any) -> None:
        if model_type is not ModelType.DECODER_ONLY:
            raise TypeError("model_type must be ModelType.DECODER_ONLY")
        self.path = Path(model_path)
        self.config = executor_config
        engine = json.loads((self.path / "config.json").read_text())
        build, mapping = engine["build_config"], engine["pretrained_config"]["mapping"]
        world = mapping["tp_size"] * mapping["pp_size"]
        device_ids = executor_config.parallel_config.device_ids
        if device_ids is not None and len(device_ids) != world:
            raise RuntimeError(f"the engine needs {world} devices, got device_ids {device_ids}")
        self.max_input_len, self.max_seq_len = build["max_input_len"], build["max_seq_len"]
        self.max_draft_len = build.get("max_draft_len", 0)
        self.tokens_per_block = build["plugin_config"]["tokens_per_block"]
        model: Any = AutoModelForCausalLM.from_pretrained(
            str(STATE.checkpoints[self.path]), local_files_only=True
        )
        self.model: Any = model.eval()
        self._queue: queue.Queue[tuple[int, Request] | None] = queue.Queue()
        self._responses: list[Response] = []
        self._stats: list[Any] = []
        self._ready = threading.Condition()
        self._cancel: set[int] = set()
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
            raise RuntimeError("the executor is shut down")
        request_id, self._next_id = self._next_id, self._next_id + 1
        self._queue.put((request_id, request))
        return request_id

    def await_responses(self, timeout: Any = None) -> list[Response]:
        with self._ready:
            if not self._responses:
                self._ready.wait(None if timeout is None else timeout.total_seconds())
            out, self._responses = self._responses, []
        return out

    def cancel_request(self, id: int) -> None:
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
            self._responses.append(response)
            self._ready.notify_all()

    def _work(self) -> None:
        while (item := self._queue.get()) is not None:
            request_id, request = item
            started = time.perf_counter()
            while time.perf_counter() - started < STATE.request_delay and request_id not in self._cancel:
                time.sleep(0.002)
            if request_id in self._cancel:
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
        if draft is not None and len(draft.tokens) > self.max_draft_len:
            return f"draft tokens ({len(draft.tokens)}) exceeds maximum draft length ({self.max_draft_len})"
        if request.output_config.return_generation_logits and not self.config.gather_generation_logits:
            return "generation logits requested but gather_generation_logits is off"
        return None

    @torch.inference_mode()
    def _run(self, request: Request) -> Result:
        sc = request.sampling_config
        greedy = sc.top_k == 1
        generator = torch.Generator().manual_seed(sc.seed) if sc.seed is not None else None

        def pick(row: torch.Tensor) -> int:
            if greedy:
                return int(row.argmax())
            return int(torch.multinomial(_probs(row, sc.temperature, sc.top_p), 1, generator=generator))

        ids = list(request.input_token_ids)
        out: list[int] = []
        rows: list[torch.Tensor] = []
        draft = request.external_draft_tokens_config
        if draft is not None and draft.tokens:
            logits = self.model(torch.tensor([ids + draft.tokens])).logits[0, len(ids) - 1 :].float()
            for i, token in enumerate(draft.tokens):
                if draft.logits is not None and not greedy:  # rejection sampling against the draft's logits
                    p = _probs(logits[i], sc.temperature, sc.top_p)
                    q = _probs(draft.logits[i], sc.temperature, sc.top_p)
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
        else:
            for _ in range(request.max_tokens):
                row = self.model(torch.tensor([ids + out])).logits[0, -1].float()
                rows.append(row)
                out.append(pick(row))
                if out[-1] == request.end_id:
                    break
        finish = FinishReason.LENGTH
        if request.end_id in out:
            out = out[: out.index(request.end_id) + 1]
            finish = FinishReason.END_ID
        out = out[: request.max_tokens]
        logits_out = (
            torch.stack(rows[: len(out)]).unsqueeze(0)
            if request.output_config.return_generation_logits
            else None
        )
        tokens = out if request.output_config.exclude_input_from_output else ids + out
        return Result(True, [tokens], [finish], logits_out)


# ------------------------------------------------------------------------------------------ the LLM API
LlmKvCacheConfig = _record("KvCacheConfig", enable_block_reuse=True, free_gpu_memory_fraction=None)
LlmSchedulerConfig = _record(
    "SchedulerConfig", capacity_scheduler_policy=CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
)
EagleDecodingConfig = _record("EagleDecodingConfig", max_draft_len=None, speculative_model_dir=None)
NGramDecodingConfig = _record(
    "NGramDecodingConfig",
    max_draft_len=None,
    max_matching_ngram_size=0,
    is_keep_all=True,
    is_use_oldest=True,
    is_public_pool=True,
)
DraftTargetDecodingConfig = _record(
    "DraftTargetDecodingConfig", max_draft_len=None, speculative_model_dir=None
)
MTPDecodingConfig = _record("MTPDecodingConfig", num_nextn_predict_layers=1)
SamplingParams = _record(
    "SamplingParams",
    max_tokens=32,
    temperature=None,
    top_p=None,
    top_k=None,
    seed=None,
    end_id=None,
    detokenize=True,
)


@dataclass
class CompletionOutput:
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None


class RequestOutput:
    """Streams one generation; yields itself after each token, as the real one does."""

    def __init__(self, llm: LLM, prompt: list[int], params: Any) -> None:
        self.llm, self.prompt, self.params = llm, prompt, params
        self.outputs = [CompletionOutput()]
        self.finished = False
        self.aborted = False

    def abort(self) -> None:
        self.aborted = True

    def __aiter__(self) -> RequestOutput:
        return self

    async def __anext__(self) -> RequestOutput:
        import asyncio

        if self.finished or self.aborted:
            raise StopAsyncIteration
        await asyncio.sleep(STATE.request_delay)
        token = await asyncio.to_thread(
            self.llm.next_token, self.prompt + self.outputs[0].token_ids, self.params
        )
        out = self.outputs[0]
        out.token_ids.append(token)
        if token == self.params.end_id or len(out.token_ids) >= self.params.max_tokens:
            out.finish_reason = "stop" if token == self.params.end_id else "length"
            self.finished = True
        return self


class LLM:
    def __init__(
        self,
        model: str,
        *,
        tokenizer: str | None = None,
        tensor_parallel_size: int = 1,
        max_batch_size: int | None = None,
        max_num_tokens: int | None = None,
        max_seq_len: int | None = None,
        kv_cache_config: Any = None,
        scheduler_config: Any = None,
        enable_chunked_prefill: bool = False,
        speculative_config: Any = None,
        disable_overlap_scheduler: bool = False,
    ) -> None:
        self.kwargs = {k: v for k, v in locals().items() if k not in ("self", "__class__")}
        loaded: Any = AutoModelForCausalLM.from_pretrained(model, local_files_only=True)
        self.model: Any = loaded.eval()
        self.requests: list[RequestOutput] = []
        self.shut = False
        STATE.llms.append(self)

    def generate_async(
        self, inputs: list[int], sampling_params: Any = None, streaming: bool = False
    ) -> RequestOutput:
        problem = STATE.fail_when(Request(inputs, sampling_params.max_tokens)) if STATE.fail_when else None
        if problem is not None:
            raise RuntimeError(problem)
        output = RequestOutput(self, list(inputs), sampling_params)
        self.requests.append(output)
        return output

    @torch.inference_mode()
    def next_token(self, ids: list[int], params: Any) -> int:
        row = self.model(torch.tensor([ids])).logits[0, -1].float()
        if params.top_k == 1:
            return int(row.argmax())
        return int(torch.multinomial(_probs(row, params.temperature, params.top_p), 1))

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
        KvCacheConfig=LlmKvCacheConfig,
        SchedulerConfig=LlmSchedulerConfig,
        CapacitySchedulerPolicy=CapacitySchedulerPolicy,
        EagleDecodingConfig=EagleDecodingConfig,
        NGramDecodingConfig=NGramDecodingConfig,
        DraftTargetDecodingConfig=DraftTargetDecodingConfig,
        MTPDecodingConfig=MTPDecodingConfig,
        SamplingParams=SamplingParams,
    )
    bindings = _module("tensorrt_llm.bindings", executor=executor)
    root = _module(
        "tensorrt_llm",
        str(tmp_path / "tensorrt_llm" / "__init__.py"),
        LLM=LLM,
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
