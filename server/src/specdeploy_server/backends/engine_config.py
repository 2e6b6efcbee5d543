"""Start-up checks of TensorRT-LLM engine directories, from their ``config.json`` alone.

Runs before any GPU work and before ``tensorrt_llm`` is imported, so a mismatch between the engines and the
server configuration is reported even on a machine without TensorRT-LLM. Every failed rule is one line naming
the engine and the field; all failures are reported together.

The fields read are the ones TensorRT-LLM's C++ runtime reads (``GptJsonConfig``): ``pretrained_config``
(``architecture``, ``dtype``, ``vocab_size``, ``mapping.tp_size``/``pp_size``) and ``build_config``
(``max_batch_size``, ``max_input_len``, ``max_seq_len``, ``max_num_tokens``, ``max_draft_len``,
``speculative_decoding_mode`` as an integer flag, ``gather_generation_logits``,
``plugin_config.use_paged_context_fmha``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy_server.config import Acceptance, Method, ServerConfig

log = logging.getLogger(__name__)

#: ``build_config.speculative_decoding_mode`` flags (TensorRT-LLM ``SpeculativeDecodingMode``)
SPECULATIVE_DECODING_MODES = {
    1: "none",
    2: "draft_tokens_external",
    4: "medusa",
    8: "lookahead_decoding",
    16: "explicit_draft_tokens",
    32: "eagle",
}
DRAFT_TOKENS_EXTERNAL = 2


class EngineConfigError(ValueError):
    """The engines do not fit the configuration; one line per failed rule."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("TensorRT-LLM engine check failed:\n" + "\n".join(f"- {p}" for p in problems))
        self.problems = problems


@dataclass(frozen=True)
class EngineFacts:
    """What the server needs to know about one engine directory."""

    role: str  # "target" or "draft"
    path: Path
    architecture: str
    dtype: str
    vocab_size: int
    tp_size: int
    pp_size: int
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int | None
    max_draft_len: int
    speculative_decoding_mode: int
    gather_generation_logits: bool
    use_paged_context_fmha: bool
    rank_files: int

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def vocab_size_padded(self) -> int:
        """The width of the engine's logits: ``vocab_size`` rounded up to a multiple of tp x pp
        (TensorRT-LLM's ``ModelConfig::getVocabSizePadded(worldSize)``)."""
        return -(-self.vocab_size // self.world_size) * self.world_size

    @property
    def mode_name(self) -> str:
        mode = self.speculative_decoding_mode
        return SPECULATIVE_DECODING_MODES.get(mode, str(mode))

    def describe(self) -> str:
        return f"{self.role} engine {self.path}"


def _field(data: dict[str, Any], dotted: str, role: str, path: Path) -> Any:
    node: Any = data
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            raise EngineConfigError([f"{role} engine {path}: config.json has no {dotted}"])
        node = node[key]
    return node


def _int(data: dict[str, Any], dotted: str, role: str, path: Path, default: int | None = None) -> int:
    try:
        value = _field(data, dotted, role, path)
    except EngineConfigError:
        if default is None:
            raise
        return default
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise EngineConfigError([f"{role} engine {path}: {dotted} must be an integer, got {value!r}"])
    return value


def read_engine(path: Path, role: str) -> EngineFacts:
    """Parse ``path/config.json`` (an engine built by ``trtllm-build``)."""
    config_file = path / "config.json"
    if not config_file.is_file():
        raise EngineConfigError([f"{role} engine {path}: no config.json (not a TensorRT-LLM engine)"])
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise EngineConfigError([f"{role} engine {path}: config.json is not readable JSON ({exc})"]) from exc
    if not isinstance(data, dict) or "build_config" not in data or "pretrained_config" not in data:
        raise EngineConfigError(
            [
                f"{role} engine {path}: config.json has no build_config/pretrained_config "
                "(a checkpoint, or an engine from a pre-0.8 builder)"
            ]
        )
    plugin = _field(data, "build_config.plugin_config", role, path)
    return EngineFacts(
        role=role,
        path=path,
        architecture=str(_field(data, "pretrained_config.architecture", role, path)),
        dtype=str(_field(data, "pretrained_config.dtype", role, path)),
        vocab_size=_int(data, "pretrained_config.vocab_size", role, path),
        tp_size=_int(data, "pretrained_config.mapping.tp_size", role, path, default=1),
        pp_size=_int(data, "pretrained_config.mapping.pp_size", role, path, default=1),
        max_batch_size=_int(data, "build_config.max_batch_size", role, path),
        max_input_len=_int(data, "build_config.max_input_len", role, path),
        max_seq_len=_int(data, "build_config.max_seq_len", role, path),
        max_num_tokens=_int(data, "build_config.max_num_tokens", role, path, default=0) or None,
        max_draft_len=_int(data, "build_config.max_draft_len", role, path, default=0),
        speculative_decoding_mode=_int(data, "build_config.speculative_decoding_mode", role, path, default=1),
        gather_generation_logits=bool(data["build_config"].get("gather_generation_logits", False)),
        use_paged_context_fmha=bool(plugin.get("use_paged_context_fmha", False)),
        rank_files=len(list(path.glob("rank*.engine"))),
    )


@dataclass(frozen=True)
class EngineSetup:
    """The checked engines and the limits the server runs under."""

    target: EngineFacts
    draft: EngineFacts | None
    max_model_len: int  # prompt + generated tokens of one request
    max_batch_size: int  # sequences stepped together (the runtime setting, capped by the engines)
    max_draft_len: int  # draft tokens per step the target accepts


def _check_engine(facts: EngineFacts, device_ids: list[int], field: str, problems: list[str]) -> None:
    where = facts.describe()
    if facts.rank_files != facts.world_size:
        problems.append(
            f"{where}: mapping.tp_size x pp_size = {facts.world_size} "
            f"but {facts.rank_files} rank*.engine files"
        )
    if facts.world_size != len(device_ids):
        problems.append(
            f"{where}: built for tp_size x pp_size = {facts.tp_size} x {facts.pp_size} = {facts.world_size} "
            f"GPUs, but placement.{field} lists {len(device_ids)} ({device_ids})"
        )


def _method_problem(config: ServerConfig) -> str | None:
    method = config.method
    if method not in (Method.DRAFT_TARGET, Method.PROMPT_LOOKUP, Method.NONE):
        return f"speculative.method {method.value} is not available with engines: use backend trtllm-llmapi"
    return None


def _kv_reuse_problem(config: ServerConfig) -> str | None:
    method = config.method
    if method != Method.NONE and not config.runtime.enable_kv_cache_reuse:
        return (
            f"runtime.enableKvCacheReuse is false; speculative.method {method.value} re-sends the whole "
            "prefix every step and needs KV cache block reuse"
        )
    return None


def settings_problems(config: ServerConfig) -> list[str]:
    """The rules of the engine backend that need no engine: what `check_engines` refuses whatever the
    engines' config.json says."""
    return [p for p in (_method_problem(config), _kv_reuse_problem(config)) if p is not None]


def check_engines(config: ServerConfig) -> EngineSetup:
    """Every rule of the engine backend; raises EngineConfigError listing all that fail."""
    method = config.method
    method_problem = _method_problem(config)
    if method_problem is not None:
        raise EngineConfigError([method_problem])
    target = read_engine(config.model.target, "target")
    draft: EngineFacts | None = None
    if method == Method.DRAFT_TARGET:
        assert config.model.draft is not None  # checked by ServerConfig
        draft = read_engine(config.model.draft, "draft")
    problems: list[str] = []
    placement, spec, runtime = config.placement, config.speculative, config.runtime
    _check_engine(target, placement.target_device_ids, "targetDeviceIds", problems)
    if draft is not None:
        _check_engine(draft, placement.draft_device_ids, "draftDeviceIds", problems)
        if draft.vocab_size != target.vocab_size:
            problems.append(
                f"{draft.describe()}: pretrained_config.vocab_size {draft.vocab_size} differs from the "
                f"target's {target.vocab_size} (draft and target must share a vocabulary)"
            )
    speculating = method != Method.NONE
    max_draft_len = spec.max_draft_len
    if speculating:
        if target.speculative_decoding_mode != DRAFT_TOKENS_EXTERNAL:
            problems.append(
                f"{target.describe()}: build_config.speculative_decoding_mode is {target.mode_name}; "
                f"speculative.method {method.value} needs an engine built with "
                "--speculative_decoding_mode draft_tokens_external"
            )
        if isinstance(spec.draft_len, int) and spec.draft_len > target.max_draft_len:
            problems.append(
                f"{target.describe()}: build_config.max_draft_len {target.max_draft_len} is below "
                f"speculative.draftLen {spec.draft_len}"
            )
        if target.max_draft_len < max_draft_len:
            if spec.draft_len == "auto":
                log.warning(
                    "speculative.maxDraftLen %d lowered to the target engine's max_draft_len %d",
                    max_draft_len,
                    target.max_draft_len,
                )
            max_draft_len = min(max_draft_len, target.max_draft_len)
        kv_reuse_problem = _kv_reuse_problem(config)
        if kv_reuse_problem is not None:
            problems.append(kv_reuse_problem)
        for facts in (target, draft):
            if facts is not None and not facts.use_paged_context_fmha:
                problems.append(
                    f"{facts.describe()}: build_config.plugin_config.use_paged_context_fmha is off; "
                    "KV cache reuse across steps needs an engine built with --use_paged_context_fmha enable"
                )
    if method == Method.DRAFT_TARGET and spec.acceptance == Acceptance.LOGITS:
        for facts in (target, draft):
            if facts is not None and not facts.gather_generation_logits:
                problems.append(
                    f"{facts.describe()}: build_config.gather_generation_logits is off; "
                    "speculative.acceptance logits needs both engines built with --gather_generation_logits"
                )
        # Draft logits go to the target as they come, one row per draft token: a wider row is cut to the
        # target's width (padding columns), a narrower one cannot be made whole.
        if draft is not None and draft.vocab_size_padded < target.vocab_size_padded:
            problems.append(
                f"{draft.describe()}: its logits are {draft.vocab_size_padded} wide "
                f"(pretrained_config.vocab_size {draft.vocab_size} padded to a multiple of tp x pp = "
                f"{draft.world_size}) but the target takes {target.vocab_size_padded} "
                f"(padded to a multiple of {target.world_size}); speculative.acceptance logits needs draft "
                "logits at least as wide as the target's: build the draft for a tp x pp that pads as far, "
                "or use acceptance tokenMatch"
            )
    # Every step sends the prefix (prompt + tokens so far) as a new request: the prefix must fit
    # max_input_len, and prefix + k + 1 (target) or prefix + k (draft) must fit max_seq_len. The scheduler
    # keeps prefix + k + 1 <= max_model_len, so this bound makes every request the engines see valid.
    engines = [target] if draft is None else [target, draft]
    limit = min(min(e.max_seq_len, e.max_input_len + 1) for e in engines)
    if config.model.max_model_len is not None:
        if config.model.max_model_len > limit:
            bound = min(engines, key=lambda e: min(e.max_seq_len, e.max_input_len + 1))
            problems.append(
                f"model.maxModelLen {config.model.max_model_len} exceeds what the engines accept: "
                f"{bound.describe()} has build_config.max_seq_len {bound.max_seq_len} and max_input_len "
                f"{bound.max_input_len} (every step re-sends prompt + generated tokens as input)"
            )
        limit = min(limit, config.model.max_model_len)
    if problems:
        raise EngineConfigError(problems)
    max_batch = min([runtime.max_batch_size, *(e.max_batch_size for e in engines)])
    if max_batch < runtime.max_batch_size:
        log.warning(
            "runtime.maxBatchSize %d lowered to the engines' max_batch_size %d",
            runtime.max_batch_size,
            max_batch,
        )
    return EngineSetup(
        target=target,
        draft=draft,
        max_model_len=limit,
        max_batch_size=max_batch,
        max_draft_len=max_draft_len if speculating else 0,
    )
