"""The `trtllm-build` flags the operator owns or models, and how an argument list is checked against them (in
Python and in CEL). `flags.py` renders the flags of a spec."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

__all__ = [
    "DRAFT_TOKEN_METHODS",
    "MODELLED_ATTRIBUTES",
    "MODELLED_BUILD_FLAGS",
    "OPERATOR_BUILD_FLAGS",
    "conflicting_args",
    "conflicting_args_cel",
    "flag_name",
]

DRAFT_TOKEN_METHODS: Final = ("draftTarget", "promptLookup")
"""Methods whose target engine takes external draft tokens (`--speculative_decoding_mode
draft_tokens_external`)."""

OPERATOR_BUILD_FLAGS: Final = (
    "--checkpoint_dir",
    "--output_dir",
    "--workers",
    "--speculative_decoding_mode",
    "--max_draft_len",
    "--use_paged_context_fmha",
    "--gather_generation_logits",
    "--gather_context_logits",
    "--gather_all_token_logits",
    "--build_config",
    "--model_config",
)
"""trtllm-build flags the operator sets (or must keep off, like context logits, which cannot be gathered with
draft tokens); `build.extraArgs` may not contain them."""

MODELLED_BUILD_FLAGS: Final = {
    "--max_batch_size": "maxBatchSize",
    "--max_num_tokens": "maxNumTokens",
    "--max_input_len": "maxInputLen",
    "--max_seq_len": "maxSeqLen",
    "--gemm_plugin": "gemmPlugin",
    "--gemm_swiglu_plugin": "gemmSwigluPlugin",
    "--low_latency_gemm_plugin": "lowLatencyGemmPlugin",
    "--gpt_attention_plugin": "gptAttentionPlugin",
    "--use_fused_mlp": "useFusedMlp",
    "--use_fp8_context_fmha": "useFp8ContextFmha",
    "--reduce_fusion": "reduceFusion",
    "--multiple_profiles": "multipleProfiles",
}
"""trtllm-build flags that have a field in `build`, in the order they are rendered; `build.extraArgs` may not
repeat them."""

MODELLED_ATTRIBUTES: Final = (
    ("--max_batch_size", "max_batch_size"),
    ("--max_num_tokens", "max_num_tokens"),
    ("--max_input_len", "max_input_len"),
    ("--max_seq_len", "max_seq_len"),
    ("--gemm_plugin", "gemm_plugin"),
    ("--gemm_swiglu_plugin", "gemm_swiglu_plugin"),
    ("--low_latency_gemm_plugin", "low_latency_gemm_plugin"),
    ("--gpt_attention_plugin", "gpt_attention_plugin"),
    ("--use_fused_mlp", "use_fused_mlp"),
    ("--use_fp8_context_fmha", "use_fp8_context_fmha"),
    ("--reduce_fusion", "reduce_fusion"),
    ("--multiple_profiles", "multiple_profiles"),
)


def flag_name(arg: str) -> str | None:
    """The flag an argument sets (`--max_draft_len=4` -> `--max_draft_len`), or None for a value."""
    if not arg.startswith("--"):
        return None
    return arg.split("=", 1)[0]


def conflicting_args(args: Iterable[str], flags: Iterable[str]) -> list[str]:
    """Arguments of `args` that set one of `flags`, also through an abbreviation (argparse accepts unambiguous
    prefixes, so `--max_draft=4` would set `--max_draft_len`)."""
    flags = tuple(flags)
    found = []
    for arg in args:
        name = flag_name(arg)
        if name is not None and any(flag.startswith(name) for flag in flags):
            found.append(arg)
    return found


def conflicting_args_cel(list_expr: str, flags: Sequence[str]) -> str:
    """CEL twin of `conflicting_args`: true when no item of the list `list_expr` sets one of `flags`."""
    quoted = ", ".join(f"'{flag}'" for flag in flags)
    name = "(a.contains('=') ? a.substring(0, a.indexOf('=')) : a)"
    return f"{list_expr}.all(a, !a.startsWith('--') || ![{quoted}].exists(f, f.startsWith({name})))"
