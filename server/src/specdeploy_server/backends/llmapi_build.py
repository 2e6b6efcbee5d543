"""Building backend ``trtllm-llmapi`` from the server configuration: what it refuses up front, the LLM's
arguments, the schedule it logs, and the engine (``trtllm_llmapi``)."""

from __future__ import annotations

import logging
import os
import uuid

from specdeploy_server.backends.errors import BackendUnavailableError, import_tensorrt_llm
from specdeploy_server.backends.llmapi_args import (
    BACKEND,
    auto_schedule,
    checkpoint_field,
    checkpoint_max_len,
    draft_len,
    guided_decoding,
    llm_arguments,
    width_rule,
)
from specdeploy_server.backends.llmapi_drafter import hints_reach_the_drafter, request_hints
from specdeploy_server.backends.llmapi_step_costs import StepCostCollector
from specdeploy_server.backends.trtllm_llmapi import FEATURES, HINTED_FEATURES, LlmApiEngine
from specdeploy_server.config import Acceptance, Method, ServerConfig
from specdeploy_server.engine import model_info
from specdeploy_server.tokenizer import HFTokenizer

log = logging.getLogger(__name__)


def settings_problems(config: ServerConfig) -> list[str]:
    """What this backend refuses before TensorRT-LLM is imported."""
    if config.speculative.acceptance == Acceptance.LOGITS:
        return [
            f"speculative.acceptance logits is not available with {BACKEND} (TensorRT-LLM decides acceptance)"
        ]
    return []


def build_llmapi_engine(config: ServerConfig) -> LlmApiEngine:
    problems = settings_problems(config)
    if problems:
        raise BackendUnavailableError("; ".join(problems))
    ids = config.placement.target_device_ids
    if ids != list(range(len(ids))) and "CUDA_VISIBLE_DEVICES" not in os.environ:
        # The LLM API places ranks on devices 0..TP-1 of what it sees: show it exactly the configured GPUs.
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in ids)
    package = import_tensorrt_llm("tensorrt_llm", BACKEND)
    llmapi = import_tensorrt_llm("tensorrt_llm.llmapi", BACKEND)
    tokenizer_path = config.model.tokenizer or config.model.target
    tokenizer = HFTokenizer(tokenizer_path, config.serving.chat_template)
    version = str(getattr(package, "__version__", "0.0"))
    hints = None
    if config.method == Method.PROMPT_LOOKUP and draft_len(config) > 0:
        if hints_reach_the_drafter():
            hints = request_hints(f"trtllm-llmapi-{uuid.uuid4().hex}")
        else:
            log.info("predictions and per-request speculation need TLLM_WORKER_USE_SINGLE_PROCESS=1: refused")
    auto = auto_schedule(config, version)
    arguments = llm_arguments(llmapi, config, tokenizer_path, auto, hints)
    if getattr(arguments["speculative_config"], "drafter", None) is None:
        hints = None  # our drafter is not in use (the version has no user-provided drafters)
    llm = package.LLM(**arguments)
    runtime = config.runtime
    max_len = (
        config.model.max_model_len or runtime.max_seq_len or checkpoint_max_len(config.model.target) or 4096
    )
    log.info(
        "trtllm-llmapi: %s, method %s, draft length %d, TP %d",
        config.model.target,
        config.method.value,
        draft_len(config),
        len(config.placement.target_device_ids),
    )
    rule = width_rule(config, arguments["speculative_config"], auto)
    if auto is not None and rule is not None and rule.schedule:
        log.info(
            "draft_len_schedule",
            extra={"schedule": dict(rule.schedule), "meaning": rule.semantics, "sources": auto.sources},
        )
    vocab_size = checkpoint_field(config.model.target, "vocab_size")
    step_costs = None if rule is None else StepCostCollector(config.model.name, rule)
    return LlmApiEngine(
        llm,
        llmapi.SamplingParams,
        lambda guide: guided_decoding(llmapi, guide),
        tokenizer,
        model_info(
            config.model.name,
            max_len,
            vocab_size,
            FEATURES if hints is None else FEATURES | HINTED_FEATURES,
            backend=BACKEND,
        ),
        max_batch_size=runtime.max_batch_size,
        max_queue_size=runtime.max_queue_size,
        draft_len=0 if config.method == Method.NONE else draft_len(config),
        hints=hints,
        step_costs=step_costs,
    )
