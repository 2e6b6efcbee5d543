"""The double of TensorRT-LLM's LLM API (``tensorrt_llm.llmapi``): its config models as strict as pydantic's,
``SamplingParams``, and an ``LLM`` that runs its checkpoint (and, when speculating, a drafter) in-process
(see tests/server/trtllm_double.py for what it rejects and how it differs from the real one)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.server.trtllm_double_configs import AUTO_NGRAM_SCHEDULE, ValidationError
from tests.server.trtllm_double_executor import Request
from tests.server.trtllm_double_matching import longest_match_draft, ngram_draft
from tests.server.trtllm_double_sampling import (
    GuideCompiler,
    GuidedDecodingParams,
    check_sampling_values,
    penalised,
    probabilities,
)
from tests.server.trtllm_double_state import current_state


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
        self.request_id = llm.next_client_id()  # GenerationResult.request_id: the executor's py_client_id
        self.llm_request: Any = None  # its LlmRequest, for a user-provided drafter
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
        await asyncio.sleep(current_state().request_delay)
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
            request=self,
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
            real = current_state().perf_metrics_count_speculation
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


#: decoding configs whose `speculative_model` the double runs as a plain draft model
DRAFT_MODEL_CONFIGS = (
    "DraftTargetDecodingConfig",
    "EagleDecodingConfig",
    "Eagle3DecodingConfig",
    "PARDDecodingConfig",
    "DFlashDecodingConfig",
)


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
        self.drafter: Any = None
        if kind == "UserProvidedDecodingConfig":
            from tests.server.trtllm_double_drafter import worker_drafter  # it imports this module

            self.drafter = worker_drafter(self.spec.drafter)
        self._client_ids = 0
        if kind in DRAFT_MODEL_CONFIGS:
            draft: Any = AutoModelForCausalLM.from_pretrained(
                self.spec.speculative_model, local_files_only=True
            )
            self.draft_model = draft.eval()
        self.requests: list[RequestOutput] = []
        self.shut = False
        self._stats: list[dict[str, Any]] = []  # iteration statistics not yet read (get_stats)
        self._stats_ready = threading.Condition()
        self._iterations = 0
        current_state().llms.append(self)

    def get_stats(self, timeout: float | None = 2) -> list[dict[str, Any]]:
        """The iteration statistics recorded since the last call (waiting up to ``timeout`` for one);
        nothing without ``enable_iter_perf_stats``."""
        with self._stats_ready:
            if not self._stats and timeout:
                self._stats_ready.wait(timeout)
            stats, self._stats = self._stats, []
        return stats

    def _record_iteration(
        self,
        seconds: float,
        draft_seconds: float,
        *,
        first: bool,
        prompt: int,
        draft: list[int],
        accepted: int,
    ) -> None:
        """One iteration's statistics, as ``IterationStats.to_json_str()`` names them (the fields our code
        reads and their neighbours): each of the double's iterations runs one request."""
        if not self.kwargs.get("enable_iter_perf_stats"):
            return
        self._iterations += 1
        stats: dict[str, Any] = {
            "iter": self._iterations,
            "iterLatencyMS": seconds * 1000,
            "numActiveRequests": sum(1 for r in self.requests if not r.finished),
            "numQueuedRequests": 0,
            "inflightBatchingStats": {
                "numScheduledRequests": 1,
                "numContextRequests": int(first),
                "numGenRequests": int(not first),
                "numPausedRequests": 0,
                "numCtxTokens": prompt if first else 0,
                "microBatchId": 0,
                "avgNumDecodedTokensPerIter": 0,
            },
        }
        if self.spec is not None:
            drafted = sum(1 for t in draft if t != 0)  # the real count skips padding (token 0)
            stats["specDecodingStats"] = {
                "numDraftTokens": drafted,
                "numAcceptedTokens": accepted,
                "numRequestsWithDraftTokens": int(drafted > 0),
                "acceptanceLength": float(accepted + 1) if drafted else 0.0,
                "iterLatencyMS": draft_seconds * 1000,  # the drafter's time: a draft model's only
                "draftOverhead": draft_seconds / seconds if seconds > 0 else 0.0,
            }
        with self._stats_ready:
            self._stats.append(stats)
            self._stats_ready.notify_all()

    def next_client_id(self) -> int:
        self._client_ids += 1
        return self._client_ids

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
        fail_when = current_state().fail_when
        problem = fail_when(Request(prompt, params.max_tokens)) if fail_when else None
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

    def _user_provided(self, ids: list[int], request: RequestOutput) -> list[int]:
        """One request's draft from the user-provided drafter, padded with 0 to max_total_draft_tokens."""
        from tests.server.trtllm_double_drafter import LlmRequest, ScheduledRequests, padded_width

        active = [r for r in self.requests if not r.finished]
        if not self.drafter.should_use_spec_decode(active):
            return []
        if request.llm_request is None:
            request.llm_request = LlmRequest(
                len(self.requests),
                request.request_id,
                [],
                len(request.prompt_token_ids),
                request.params.max_tokens,
            )
        llm_request = request.llm_request
        llm_request.tokens, llm_request.state = list(ids), "GENERATION_IN_PROGRESS"
        self.drafter.prepare_draft_tokens(ScheduledRequests([], [llm_request]), None)
        asked = getattr(self.drafter, "max_total_draft_tokens", self.spec.max_total_draft_tokens)
        width = padded_width(self.drafter, self.spec)
        draft = list(llm_request.py_draft_tokens)
        if len(draft) > asked:
            raise ValueError(f"{len(draft)} draft tokens > max_total_draft_tokens {width}")
        return draft + [0] * (width - len(draft))

    def _draft(self, ids: list[int], request: RequestOutput | None = None) -> list[int]:
        spec, kind = self.spec, type(self.spec).__name__
        if self.drafter is not None and request is not None:
            return self._user_provided(ids, request)
        active = sum(1 for r in self.requests if not r.finished)
        if getattr(spec, "max_concurrency", None) is not None and active > spec.max_concurrency:
            return []  # speculation is off above max_concurrency active requests
        enhancer = getattr(spec, "sa_config", None)
        if enhancer is not None:
            # SA overrides the neural draft where its match is at least `threshold` tokens long.
            matched = longest_match_draft(ids, spec.max_draft_len, enhancer.threshold)
            if matched:
                return matched
        if self.draft_model is not None:
            out: list[int] = []
            for _ in range(spec.max_draft_len):
                out.append(int(self.draft_model(torch.tensor([ids + out])).logits[0, -1].argmax()))
            return out
        if kind == "NGramDecodingConfig":
            return ngram_draft(ids, spec.max_draft_len, spec.max_matching_ngram_size)
        if kind == "SADecodingConfig":
            size = spec.max_matching_ngram_size
            if size == -1:
                return longest_match_draft(ids, spec.max_draft_len, 1)
            return ngram_draft(ids, spec.max_draft_len, size) if len(ids) > size else []
        if kind == "AutoDecodingConfig":
            for bound, k, n in AUTO_NGRAM_SCHEDULE:
                if active <= bound:
                    return ngram_draft(ids, k, n)
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
        request: RequestOutput | None = None,
    ) -> tuple[list[int], int, int]:
        """One iteration of one request: (new tokens, drafted, accepted). The context step yields one
        token; a generation step verifies the drafter's tokens and yields the accepted ones + one. Each
        position is picked from the target's logits there, penalised and masked by the grammar state after
        the tokens before it (the matcher consumes each picked token)."""
        ids = prompt + output
        started = time.perf_counter()
        draft = [] if first else self._draft(ids, request)
        draft_seconds = time.perf_counter() - started if self.draft_model is not None else 0.0
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
        accepted = len(out) - 1 if draft else 0
        self._record_iteration(
            time.perf_counter() - started,
            draft_seconds,
            first=first,
            prompt=len(prompt),
            draft=draft,
            accepted=accepted,
        )
        return out, len(draft), accepted

    def shutdown(self) -> None:
        self.shut = True
