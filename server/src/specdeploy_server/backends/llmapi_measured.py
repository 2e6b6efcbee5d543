"""Measured costs and acceptance for ``draft_len_schedule`` on ``trtllm-llmapi``: what the deployment's
earlier pods measured, as the operator hands it to the next ones (``speculative.measuredCostsFile``, the
ConfigMap's ``measured.json``; docs/trtllm.md, "Draft length by batch size").

The file (JSON, every field optional)::

    {"measuredAt": "2026-11-27T16:00:00Z",
     "acceptanceRate": 0.62,                 # accepted / drafted draft tokens
     "draftTokensPerSpeculatingStep": 3.8,   # drafted / sequence steps that drafted
     "targetPass": [{"tokens": 45, "seconds": 0.0213, "count": 120}, ...],
     "draftPass": [{"sequences": 8, "seconds": 0.0015, "count": 300}, ...]}

``targetPass``: seconds of the target's pass by the tokens it verified; ``draftPass``: seconds of one
draft-model pass by the sequences it drafted for (``llmapi_step_costs`` measures both). Between measured
sizes a cost is interpolated linearly; below the smallest it is that size's (a pass is memory-bound there);
above the largest it grows in proportion to the size (compute-bound: the pessimistic guess, so an unmeasured
large batch does not look cheap to speculate at).

A missing file is normal (a deployment's first pods); a file that cannot be read is logged and ignored:
the schedule then comes from the preset, as it would without measurements.
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Protocol

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from specdeploy_server.backends.step_costs import (
    SpeculationPreset,
    alpha_for_tokens_per_step,
    draft_call_seconds,
)

log = logging.getLogger("specdeploy.llmapi")

__all__ = [
    "MeasuredCosts",
    "PassCost",
    "PassCosts",
    "ScheduleCosts",
    "read_measured",
    "schedule_costs",
]


class PassCost(Protocol):
    """Seconds of one pass by its size, and of a draft call of several passes."""

    def seconds(self, tokens: int) -> float: ...

    def draft_seconds(self, draft_lens: list[int]) -> float: ...


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="ignore", frozen=True)


class TargetPoint(_Model):
    tokens: Annotated[float, Field(gt=0)]
    seconds: Annotated[float, Field(gt=0)]
    count: Annotated[float, Field(ge=0)] = 0


class DraftPoint(_Model):
    sequences: Annotated[float, Field(gt=0)]
    seconds: Annotated[float, Field(gt=0)]
    count: Annotated[float, Field(ge=0)] = 0


class MeasuredCosts(_Model):
    """The file's content (module docstring)."""

    measured_at: str | None = None
    acceptance_rate: Annotated[float, Field(ge=0, le=1)] | None = None
    draft_tokens_per_speculating_step: Annotated[float, Field(gt=0)] | None = None
    target_pass: list[TargetPoint] = []
    draft_pass: list[DraftPoint] = []

    def alpha(self, max_draft_len: int) -> float | None:
        """The per-token acceptance probability that gives the measured tokens per speculating step at the
        measured draft length (None without both figures)."""
        rate, k = self.acceptance_rate, self.draft_tokens_per_speculating_step
        if rate is None or k is None:
            return None
        k = min(k, float(max_draft_len)) if max_draft_len > 0 else k
        return alpha_for_tokens_per_step(1.0 + rate * k, k)


@dataclass(frozen=True)
class PassCosts:
    """Measured seconds of a pass by size: ``points`` (size, seconds), sizes ascending and distinct."""

    points: tuple[tuple[float, float], ...]

    @classmethod
    def of(cls, points: Sequence[tuple[float, float]]) -> PassCosts | None:
        by_size: dict[float, float] = {}
        for size, seconds in points:
            by_size[size] = seconds
        return cls(tuple(sorted(by_size.items()))) if by_size else None

    def seconds(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        sizes = [size for size, _ in self.points]
        first_size, first = self.points[0]
        last_size, last = self.points[-1]
        if tokens <= first_size:
            return first
        if tokens >= last_size:
            return last * tokens / last_size
        at = bisect.bisect_right(sizes, tokens)
        (x0, y0), (x1, y1) = self.points[at - 1], self.points[at]
        return y0 + (y1 - y0) * (tokens - x0) / (x1 - x0)

    def draft_seconds(self, draft_lens: list[int]) -> float:
        return draft_call_seconds(self.seconds, draft_lens)


@dataclass(frozen=True)
class ScheduleCosts:
    """What a schedule is computed from, and where each part came from (``measured`` or ``preset``)."""

    alpha: float
    target: PassCost
    draft: PassCost | None
    sources: dict[str, str]


def read_measured(path: Path | None) -> MeasuredCosts | None:
    """The measured costs in ``path``; None when there is no such file or it cannot be read (logged)."""
    if path is None or not path.is_file():
        return None
    try:
        return MeasuredCosts.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError) as error:
        log.warning(
            "measured costs not used: the preset decides the schedule",
            extra={"file": str(path), "error": str(error).splitlines()[0]},
        )
        return None


def schedule_costs(
    measured: MeasuredCosts | None,
    preset: SpeculationPreset,
    *,
    max_draft_len: int,
    drafts_with_a_model: bool,
) -> ScheduleCosts:
    """Measured figures where there are some, the preset's elsewhere. A measured target pass without a
    measured draft pass already holds the drafting (the release did not report the drafter's time apart),
    so no draft cost is added to it."""
    alpha = measured.alpha(max_draft_len) if measured else None
    target = PassCosts.of([(p.tokens, p.seconds) for p in measured.target_pass]) if measured else None
    draft = PassCosts.of([(p.sequences, p.seconds) for p in measured.draft_pass]) if measured else None
    sources = {
        "acceptance": "preset" if alpha is None else "measured",
        "target": "preset" if target is None else "measured",
    }
    draft_cost: PassCost | None = None
    if drafts_with_a_model:
        if draft is not None:
            draft_cost, sources["draft"] = draft, "measured"
        elif target is None:
            draft_cost, sources["draft"] = preset.draft, "preset"
        else:
            sources["draft"] = "in the target pass"
    return ScheduleCosts(
        alpha=preset.acceptance.mean if alpha is None else alpha,
        target=preset.target if target is None else target,
        draft=draft_cost,
        sources=sources,
    )
