"""Build an engine from a ServerConfig, importing only the backend it needs."""

from __future__ import annotations

import concurrent.futures
import logging

from specdeploy_server.backends.errors import BackendUnavailableError
from specdeploy_server.config import Backend, Method, ServerConfig, detect_backend, method_backend_problem
from specdeploy_server.core.drafters import Drafter, DraftModelDrafter, NoDrafter, PromptLookupDrafter
from specdeploy_server.core.scheduler import SchedulerObserver, SchedulerSettings, SpeculativeScheduler
from specdeploy_server.engine import ALL_FEATURES, Engine, EngineClient, model_info

__all__ = ["BackendUnavailableError", "build_engine", "resolve_backend", "scheduler_settings"]

log = logging.getLogger(__name__)


def resolve_backend(config: ServerConfig) -> Backend:
    if config.backend != Backend.AUTO:
        return config.backend
    return detect_backend(config.model.target, config.method)


#: the longest draft a prediction proposes in one step on the reference backend (its verify pass takes any)
PREDICTION_MAX_DRAFT_LEN = 64


def scheduler_settings(config: ServerConfig, max_model_len: int) -> SchedulerSettings:
    spec = config.speculative
    return SchedulerSettings(
        max_batch_size=config.runtime.max_batch_size,
        max_queue_size=config.runtime.max_queue_size,
        max_model_len=max_model_len,
        acceptance=spec.acceptance.value,
        draft_len=None if spec.draft_len == "auto" else spec.draft_len,
        disable_above_concurrency=spec.disable_above_concurrency,
        max_draft_len=spec.max_draft_len,
    )


def startup_problems(config: ServerConfig) -> list[str]:
    """What `build_engine` refuses before it loads a model, reads an engine or imports TensorRT-LLM: the
    checks of a valid ServerConfig that depend on nothing but the configuration (the operator's tests hold
    every configuration it renders to these)."""
    backend = resolve_backend(config)
    problem = method_backend_problem(config, backend)
    if problem is not None:
        return [problem]
    if backend == Backend.TRTLLM_ENGINE:
        from specdeploy_server.backends import engine_config  # noqa: PLC0415

        return engine_config.settings_problems(config)
    if backend == Backend.TRTLLM_LLMAPI:
        from specdeploy_server.backends import llmapi_build  # noqa: PLC0415

        return llmapi_build.settings_problems(config)
    return []


def build_engine(config: ServerConfig, observer: SchedulerObserver | None = None) -> EngineClient:
    """The engine of the configured backend; TensorRT-LLM is imported only by its backends."""
    backend = resolve_backend(config)
    problem = method_backend_problem(config, backend)
    if problem is not None:
        raise BackendUnavailableError(problem)
    if backend == Backend.TRTLLM_ENGINE:
        from specdeploy_server.backends.trtllm_engine import build_trtllm_engine  # noqa: PLC0415

        return build_trtllm_engine(config, observer)
    if backend == Backend.TRTLLM_LLMAPI:
        from specdeploy_server.backends.llmapi_build import build_llmapi_engine  # noqa: PLC0415

        return build_llmapi_engine(config)
    return _build_reference(config, observer)


def _build_reference(config: ServerConfig, observer: SchedulerObserver | None) -> Engine:
    import torch  # noqa: PLC0415 (lazy: only this backend needs torch)

    from specdeploy_server.backends.reference import (  # noqa: PLC0415
        CachedModel,
        ReferenceDraftExecutor,
        ReferenceTargetExecutor,
        max_position_embeddings,
        resolve_device,
        resolve_dtype,
    )
    from specdeploy_server.tokenizer import HFTokenizer  # noqa: PLC0415

    placement = config.placement
    if placement.cpu_threads is not None:
        torch.set_num_threads(placement.cpu_threads)
    target_device = resolve_device(placement.device, placement.target_device_ids)
    target = CachedModel(config.model.target, target_device, resolve_dtype(config.model.dtype, target_device))
    worker = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference-backend")
    method = config.method
    drafter: Drafter
    if method == Method.DRAFT_TARGET:
        assert config.model.draft is not None  # checked by the config model
        draft_device = resolve_device(placement.device, placement.draft_device_ids)
        draft = CachedModel(config.model.draft, draft_device, resolve_dtype(config.model.dtype, draft_device))
        if draft.vocab_size != target.vocab_size:
            raise ValueError(
                f"draft vocabulary ({draft.vocab_size}) differs from the target's ({target.vocab_size})"
            )
        drafter = DraftModelDrafter(ReferenceDraftExecutor(draft, worker))
    elif method == Method.EAGLE3:
        from specdeploy_server.backends.eagle3_drafter import Eagle3DraftExecutor, load_head_for  # noqa: PLC0415

        assert config.model.speculative_model is not None  # checked by the config model
        head = load_head_for(config.model.speculative_model, target)
        drafter = DraftModelDrafter(Eagle3DraftExecutor(head, target, worker), name="eagle3")
    elif method == Method.PROMPT_LOOKUP:
        drafter = PromptLookupDrafter(config.speculative.prompt_lookup.max_matching_ngram_size)
    else:
        drafter = NoDrafter()
    tokenizer = HFTokenizer(config.model.tokenizer or config.model.target, config.serving.chat_template)
    max_len = config.model.max_model_len or max_position_embeddings(config.model.target) or 4096
    scheduler = SpeculativeScheduler(
        ReferenceTargetExecutor(
            target,
            worker,
            # the deployment's drafts stay within speculative.maxDraftLen (the scheduler's cap); a request's
            # prediction, free to propose, may draft up to this many tokens in one step
            max_draft_len=max(config.speculative.max_draft_len, PREDICTION_MAX_DRAFT_LEN),
            # pays where it saves passes (rejected proposals); for plain decoding the pass it moves earlier
            # shares the interpreter lock with the event loop's work, which measured slower (docs/server.md)
            run_ahead=method == Method.PROMPT_LOOKUP,
        ),
        drafter,
        scheduler_settings(config, max_len),
        observer,
    )
    log.info(
        "reference backend: target %s on %s, method %s, draftLen %s, acceptance %s",
        config.model.target,
        target_device,
        method.value,
        config.speculative.draft_len,
        config.speculative.acceptance.value,
    )
    return Engine(
        tokenizer,
        scheduler,
        model_info(config.model.name, max_len, target.vocab_size, ALL_FEATURES),
        on_close=worker.shutdown,
    )
