"""How long a simulated GPU step takes, and how often a simulated target accepts draft tokens.

The stand-in executors (:mod:`specdeploy_server.backends.standin`) sleep for the time these models give, so
that the scheduler and ``draftLen: auto`` meet the trade-off a real GPU poses:

* **A forward pass is memory-bound below a knee and compute-bound above it.** Over ``tokens`` tokens (all
  sequences of the batch together) it takes ``memory_bound_seconds * max(1, tokens / knee_tokens)``: reading
  the weights once costs the same for 1 token as for ``knee_tokens``; beyond that each token adds
  ``memory_bound_seconds / knee_tokens`` of arithmetic. A verify call over B sequences with k+1 tokens each is
  one pass over B*(k+1) tokens; a draft call proposing k tokens is k passes of the draft model, pass j over
  the sequences still drafting at that depth.
* **Acceptance** is per draft token, independent, with probability alpha: either one alpha for every prompt,
  or a per-prompt alpha drawn from a Beta distribution around the mean (real prompts differ).

The presets are *estimates* derived from seed 003 (NVIDIA's TensorRT-LLM draft-target figures, Nov 2024,
FP8, draft length 10): the plain tokens/s gives the memory-bound step time; an assumed draft pass time and
the measured speculative tokens/s give alpha (the one alpha that reproduces the measurement); the knees are
assumptions (64 target tokens per pass: a few hundred FP8 TFLOP/s achieved on an H200), with which
speculation stops paying between 32 and 64 concurrent sequences, as users saw it stop paying under load
(llm-d#2074, KAITO #2286). None of this is a measurement of ours.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, replace

__all__ = [
    "PRESETS",
    "AcceptanceModel",
    "SpeculationPreset",
    "StepTimeModel",
    "alpha_for_tokens_per_step",
    "draft_call_seconds",
    "expected_tokens_per_step",
]


def expected_tokens_per_step(alpha: float, k: float) -> float:
    """Tokens one sequence step emits when each of k draft tokens is accepted with probability alpha."""
    if alpha >= 1.0:
        return float(k + 1)
    return float((1.0 - alpha ** (k + 1)) / (1.0 - alpha))


def draft_call_seconds(pass_seconds: Callable[[int], float], draft_lens: list[int]) -> float:
    """A draft call of passes costing ``pass_seconds(sequences)``: pass j runs over the sequences proposing
    at least j tokens."""
    passes = max(draft_lens, default=0)
    return sum(pass_seconds(sum(1 for k in draft_lens if k >= j)) for j in range(1, passes + 1))


def alpha_for_tokens_per_step(tokens_per_step: float, k: float) -> float:
    """The alpha with ``expected_tokens_per_step(alpha, k) == tokens_per_step`` (bisection)."""
    if not 1.0 <= tokens_per_step <= k + 1:
        raise ValueError(f"{tokens_per_step} tokens per step is impossible with draft length {k}")
    low, high = 0.0, 1.0
    for _ in range(60):
        mid = (low + high) / 2
        if expected_tokens_per_step(mid, k) < tokens_per_step:
            low = mid
        else:
            high = mid
    return (low + high) / 2


@dataclass(frozen=True)
class StepTimeModel:
    """Seconds of one forward pass over ``tokens`` tokens: ``max(memory_bound_seconds, c * tokens)`` with
    ``c = memory_bound_seconds / knee_tokens`` (an infinite knee: the same time whatever the batch)."""

    memory_bound_seconds: float
    knee_tokens: float = math.inf

    def seconds(self, tokens: int) -> float:
        if tokens <= 0:
            return 0.0
        return self.memory_bound_seconds * max(1.0, tokens / self.knee_tokens)

    def draft_seconds(self, draft_lens: list[int]) -> float:
        return draft_call_seconds(self.seconds, draft_lens)

    def scaled(self, factor: float) -> StepTimeModel:
        return replace(self, memory_bound_seconds=self.memory_bound_seconds * factor)


@dataclass(frozen=True)
class AcceptanceModel:
    """Per-token acceptance: ``mean`` for every prompt, or, with ``concentration``, a per-prompt alpha drawn
    from Beta(mean * concentration, (1 - mean) * concentration) (smaller concentration: wider spread)."""

    mean: float
    concentration: float | None = None

    def draw(self, rng: random.Random) -> float:
        if self.concentration is None or self.mean in (0.0, 1.0):
            return self.mean
        return rng.betavariate(self.mean * self.concentration, (1.0 - self.mean) * self.concentration)


@dataclass(frozen=True)
class SpeculationPreset:
    """A target/draft pair's step times and acceptance (estimates; see the module docstring)."""

    name: str
    description: str
    target: StepTimeModel
    draft: StepTimeModel
    acceptance: AcceptanceModel
    max_draft_len: int = 10

    def step_seconds(self, batch: int, k: int) -> float:
        """One step of ``batch`` sequences drafting ``k`` tokens each: k draft passes, one verify pass."""
        return self.draft.draft_seconds([k] * batch) + self.target.seconds(batch * (k + 1))

    def predicted_tokens_per_second(self, batch: int, k: int) -> float:
        """Expected emitted tokens/s of the batch at constant alpha = the acceptance mean."""
        return batch * expected_tokens_per_step(self.acceptance.mean, k) / self.step_seconds(batch, k)

    def scaled(self, factor: float) -> SpeculationPreset:
        """The same pair with every time multiplied by ``factor`` (a faster-running simulation)."""
        return replace(self, target=self.target.scaled(factor), draft=self.draft.scaled(factor))

    @classmethod
    def from_measurement(
        cls,
        name: str,
        description: str,
        *,
        plain_tokens_per_second: float,
        speculative_tokens_per_second: float,
        measured_draft_len: int,
        draft_pass_seconds: float,
        knee_tokens: float,
        draft_knee_tokens: float,
        concentration: float | None = None,
    ) -> SpeculationPreset:
        """Derive a preset from a batch-1 measurement: target step = 1 / plain tokens/s; alpha such that the
        speculative tokens/s is reproduced with ``measured_draft_len`` tokens per step."""
        verify_seconds = 1.0 / plain_tokens_per_second
        step = measured_draft_len * draft_pass_seconds + verify_seconds
        alpha = alpha_for_tokens_per_step(speculative_tokens_per_second * step, measured_draft_len)
        return cls(
            name,
            description,
            StepTimeModel(verify_seconds, knee_tokens),
            StepTimeModel(draft_pass_seconds, draft_knee_tokens),
            AcceptanceModel(round(alpha, 4), concentration),
        )


#: Seed 003: Llama 3.1 70B alone 51.14 tok/s on one H200, 146.05 tok/s with Llama 3.2 1B as draft; Llama 3.1
#: 405B on 4xH200 33.46 tok/s alone, 120.75 with Llama 3.2 3B (draft length 10, FP8). Assumed: a 1B draft pass
#: 1.5 ms, a 3B pass on 4 GPUs 2.5 ms; knees at 64 target tokens and 256 draft tokens per pass.
PRESETS: dict[str, SpeculationPreset] = {
    preset.name: preset
    for preset in (
        SpeculationPreset.from_measurement(
            "llama70b-1b-h200",
            "Llama 3.1 70B + 3.2 1B draft, 1xH200 (seed 003: 51.14 -> 146.05 tok/s)",
            plain_tokens_per_second=51.14,
            speculative_tokens_per_second=146.05,
            measured_draft_len=10,
            draft_pass_seconds=0.0015,
            knee_tokens=64,
            draft_knee_tokens=256,
        ),
        SpeculationPreset.from_measurement(
            "llama405b-3b-4xh200",
            "Llama 3.1 405B + 3.2 3B draft, 4xH200 (seed 003: 33.46 -> 120.75 tok/s), per-prompt alpha",
            plain_tokens_per_second=33.46,
            speculative_tokens_per_second=120.75,
            measured_draft_len=10,
            draft_pass_seconds=0.0025,
            knee_tokens=64,
            draft_knee_tokens=256,
            concentration=12.0,
        ),
    )
}
