"""Request fields -> SamplingParams, and which engine features a request needs."""

from __future__ import annotations

import numpy as np

from specdeploy_server.api.errors import BadRequestError
from specdeploy_server.api.protocol import ChatCompletionRequest, CompletionRequest
from specdeploy_server.core.types import SamplingParams
from specdeploy_server.engine import Feature

#: OpenAI's bound on a logit_bias value
MAX_LOGIT_BIAS = 100.0

Request = CompletionRequest | ChatCompletionRequest


def _logit_bias(req: Request, vocab_size: int | None) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in (req.logit_bias or {}).items():
        try:
            token = int(key)
        except ValueError:
            raise BadRequestError(
                f"logit_bias keys must be token ids, got '{key}'", param="logit_bias"
            ) from None
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            raise BadRequestError(f"logit_bias token {token} is not in [0, {vocab_size})", param="logit_bias")
        if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
            raise BadRequestError(
                f"logit_bias values must be in [-100, 100], got {value}", param="logit_bias"
            )
        out[token] = float(value)
    return out


def unsigned_seed(seed: int) -> int:
    """Any integer seed as the unsigned 64-bit one the generators take (numpy's, TensorRT-LLM's
    ``random_seed``): seeds in [0, 2**64) as they are, others modulo 2**64 (-1 is 2**64 - 1), where a negative
    seed used to fail the request with 500."""
    return seed % 2**64


def sampling_params(req: Request, vocab_size: int | None) -> SamplingParams:
    return SamplingParams(
        temperature=req.temperature,
        top_p=req.top_p,
        seed=None if req.seed is None else unsigned_seed(req.seed),
        top_k=max(req.top_k or 0, 0),
        min_p=req.min_p or 0.0,
        presence_penalty=req.presence_penalty or 0.0,
        frequency_penalty=req.frequency_penalty or 0.0,
        repetition_penalty=req.repetition_penalty or 1.0,
        logit_bias=_logit_bias(req, vocab_size),
        logprobs=req.top_logprobs_wanted(),
        min_tokens=req.min_tokens,
        stop_token_ids=_stop_token_ids(req, vocab_size),
        ignore_eos=req.ignore_eos,
    )


def _stop_token_ids(req: Request, vocab_size: int | None) -> frozenset[int]:
    out = frozenset(req.stop_token_ids or ())
    if out and (min(out) < 0 or (vocab_size is not None and max(out) >= vocab_size)):
        raise BadRequestError(
            f"stop_token_ids must be token ids in [0, {vocab_size})", param="stop_token_ids"
        )
    return out


def required_features(req: Request, grammar: bool) -> list[tuple[str, str]]:
    """``(field, feature)`` for every field set to something beyond plain sampling."""
    out: list[tuple[str, str]] = []
    if req.presence_penalty:
        out.append(("presence_penalty", Feature.PENALTIES))
    if req.frequency_penalty:
        out.append(("frequency_penalty", Feature.PENALTIES))
    if req.repetition_penalty not in (None, 1.0):
        out.append(("repetition_penalty", Feature.PENALTIES))
    if req.logit_bias:
        out.append(("logit_bias", Feature.LOGIT_BIAS))
    if req.top_k is not None and req.top_k > 0:
        out.append(("top_k", Feature.FILTERS))
    if req.min_p:
        out.append(("min_p", Feature.FILTERS))
    if req.min_tokens:
        out.append(("min_tokens", Feature.MIN_TOKENS))
    if req.stop_token_ids:
        out.append(("stop_token_ids", Feature.STOP_TOKENS))
    if req.ignore_eos:
        out.append(("ignore_eos", Feature.STOP_TOKENS))
    if req.top_logprobs_wanted() is not None:
        out.append(("logprobs", Feature.LOGPROBS))
        if isinstance(req, CompletionRequest) and req.echo:
            out.append(("echo", Feature.PROMPT_LOGPROBS))
    if req.prediction is not None:
        out.append(("prediction", Feature.PREDICTION))
    if req.speculation is not None and req.speculation.cap() is not None:
        out.append(("speculation", Feature.SPECULATION_CONTROL))
    if grammar:
        tools = isinstance(req, ChatCompletionRequest) and req.calls_tools()
        out.append(("tool_choice" if tools else "response_format", Feature.GRAMMAR))
        if not tools and (req.response_format or {}).get("type") == "llguidance":
            out.append(("response_format", Feature.GRAMMAR_LLGUIDANCE))
    return out


def choice_seed(seed: int | None, index: int) -> int | None:
    """Choice 0 uses the request's seed as given (n=1 samples what it always did); choice i > 0 a seed
    derived from (seed, i), so the choices are independent and the request is still reproducible."""
    if seed is None or index == 0:
        return seed
    return int(np.random.SeedSequence([seed & (2**63 - 1), index]).generate_state(1)[0])
