"""``draft_len_schedule`` (batch-size thresholds -> draft length) for ``draftLen: auto`` on ``trtllm-llmapi``,
from our cost model: per batch size the draft length with the most expected tokens per second.

Model: a step of ``b`` sequences drafting ``k`` emits ``b * E(alpha, k)`` tokens (core/adaptive.py) and costs
``k`` draft passes (none for prompt lookup) plus one target pass over ``b * (w + 1)`` tokens, where ``w`` is
what the target verifies. The pass costs and alpha are what the deployment's earlier pods measured
(``llmapi_measured``) where there are such figures, else the ``llama70b-1b-h200`` preset
(``backends/step_costs.py``: an estimate from published figures, a target pass memory-bound below a knee of
64 tokens and compute-bound above it):

* ``lower`` meaning (thresholds are lower bounds, ``{1: 4, 4: 2, 8: 0}``: batch >= 1 -> 4, >= 4 -> 2, >= 8
  off; TensorRT-LLM 1.2 and earlier): only the drafter shortens, the target still verifies ``max_draft_len``
  positions, so ``w = max_draft_len`` for any k > 0; the schedule must map 1 to ``max_draft_len``.
* ``upper`` meaning (thresholds are upper bounds, ``{4: 4, 8: 2}``: 1-4 -> 4, 5-8 -> 2, above 8 off; the
  newer releases): verification shrinks with the draft, ``w = k``; the smallest key must map to
  ``max_draft_len`` too, and ``max_concurrency`` may not come beside a schedule (:func:`cap_schedule`).

The schedule is fixed when the LLM is constructed (at start-up): new measurements reach it at the next
pod start (docs/trtllm.md).
"""

from __future__ import annotations

import re
from typing import Literal

from specdeploy_server.backends.llmapi_measured import PassCost, ScheduleCosts, schedule_costs
from specdeploy_server.backends.step_costs import PRESETS, expected_tokens_per_step

Semantics = Literal["lower", "upper"]

#: the defaults the schedule is computed from where nothing was measured
COST_PRESET = PRESETS["llama70b-1b-h200"]
#: releases from this (major, minor) on read thresholds as upper bounds (upstream changed the meaning in
#: March 2026, after 1.2.x; the first release with it is assumed, not verified)
UPPER_BOUNDS_FROM = (1, 3)


def schedule_semantics(version: str) -> Semantics:
    """How this TensorRT-LLM version reads ``draft_len_schedule``'s keys."""
    match = re.match(r"(\d+)\.(\d+)", version)
    if match is None:
        raise ValueError(f"cannot read TensorRT-LLM version {version!r}")
    return "upper" if (int(match[1]), int(match[2])) >= UPPER_BOUNDS_FROM else "lower"


def best_draft_len(
    batch: int,
    max_draft_len: int,
    semantics: Semantics,
    *,
    alpha: float,
    target: PassCost,
    draft: PassCost | None,
) -> int:
    """The draft length with the most expected tokens per second at this batch size (ties: the shorter)."""
    best, best_rate = 0, 0.0
    for k in range(max_draft_len + 1):
        width = k if semantics == "upper" or k == 0 else max_draft_len
        seconds = target.seconds(batch * (width + 1))
        if draft is not None:
            seconds += draft.draft_seconds([k] * batch)
        rate = batch * expected_tokens_per_step(alpha, k) / seconds
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = k, rate
    return best


def draft_len_schedule(
    max_draft_len: int,
    max_batch_size: int,
    semantics: Semantics,
    *,
    drafts_with_a_model: bool,
    alpha: float | None = None,
    costs: ScheduleCosts | None = None,
) -> dict[int, int]:
    """The schedule in the version's meaning: every batch size up to ``max_batch_size`` gets the length
    :func:`best_draft_len` chooses for it (``lower``: 1 always gets ``max_draft_len``, as required), from
    ``costs`` (default: the preset's; ``alpha`` overrides theirs)."""
    if max_draft_len <= 0 or max_batch_size <= 0:
        raise ValueError("max_draft_len and max_batch_size must be > 0")
    if costs is None:
        costs = schedule_costs(
            None, COST_PRESET, max_draft_len=max_draft_len, drafts_with_a_model=drafts_with_a_model
        )
    mean = costs.alpha if alpha is None else alpha
    lengths = [
        best_draft_len(b, max_draft_len, semantics, alpha=mean, target=costs.target, draft=costs.draft)
        for b in range(1, max_batch_size + 1)
    ]
    # In both meanings TensorRT-LLM requires the smallest key (batch size 1) to map to max_draft_len
    # (llm_args.py, `validate_draft_len_schedule_and_sort`).
    lengths[0] = max_draft_len
    schedule: dict[int, int] = {}
    if semantics == "lower":  # the first batch size of each run
        previous = None
        for batch, k in enumerate(lengths, start=1):
            if k != previous:
                schedule[batch] = k
            previous = k
        return schedule
    for batch, k in enumerate(lengths, start=1):  # upper bounds: the last batch size of each run
        if batch == max_batch_size or lengths[batch] != k:
            schedule[batch] = k
    while len(schedule) > 1 and schedule[max(schedule)] == 0:  # above the last key is off anyway
        del schedule[max(schedule)]
    return schedule


def cap_schedule(schedule: dict[int, int], ceiling: int) -> dict[int, int]:
    """An upper-bounds schedule that also turns speculation off above `ceiling` requests: what
    ``max_concurrency`` would do, which the newer releases refuse beside a schedule (they turn a lone
    ``max_concurrency`` into ``{max_concurrency: max_draft_len}`` themselves)."""
    capped: dict[int, int] = {}
    for batch, k in sorted(schedule.items()):
        if batch >= ceiling:
            capped[ceiling] = k
            break
        capped[batch] = k
    return capped
