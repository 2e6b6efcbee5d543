"""Adaptive draft length (``draftLen: auto``).

Model: each draft token is accepted independently with probability alpha, so a step proposing k tokens emits
E(k) = (1 - alpha^(k+1)) / (1 - alpha) tokens and costs k*c_draft + c_verify. We pick the k in [0, max_k]
maximising
E(k) / cost(k). alpha is the maximum-likelihood estimate for a geometric run truncated at k: accepted
tokens divided by
(accepted tokens + steps that ended in a rejection). Costs are exponential moving averages of measured times.
"""

from __future__ import annotations

from dataclasses import dataclass


def expected_tokens_per_step(alpha: float, k: int) -> float:
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def choose_draft_len(alpha: float, draft_token_cost: float, verify_cost: float, max_k: int) -> int:
    """The k in [0, max_k] with the highest expected tokens per second."""
    best_k, best_rate = 0, 0.0
    for k in range(max_k + 1):
        cost = k * draft_token_cost + verify_cost
        rate = expected_tokens_per_step(alpha, k) / cost if cost > 0 else float(k + 1)
        if rate > best_rate * (1 + 1e-9):
            best_k, best_rate = k, rate
    return best_k


@dataclass
class DraftLenController:
    """Tracks acceptance and step costs; ``fixed`` disables adaptation."""

    max_k: int
    fixed: int | None = None
    smoothing: float = 0.1
    initial: int = 4
    #: when the model says "don't draft", still draft one token every this many steps to keep measuring alpha
    explore_every: int = 32
    # state
    accepted: float = 0.0
    rejections: float = 0.0
    draft_token_cost: float | None = None
    verify_cost: float | None = None
    _steps_without_draft: int = 0

    @property
    def alpha(self) -> float:
        total = self.accepted + self.rejections
        return self.accepted / total if total > 0 else 0.5

    def next_k(self) -> int:
        if self.fixed is not None:
            return min(self.fixed, self.max_k)
        if self.draft_token_cost is None or self.verify_cost is None:
            return min(self.initial, self.max_k)
        k = choose_draft_len(self.alpha, self.draft_token_cost, self.verify_cost, self.max_k)
        if k == 0 and self.max_k > 0:
            self._steps_without_draft += 1
            if self._steps_without_draft >= self.explore_every:
                self._steps_without_draft = 0
                return 1
        return k

    def observe_acceptance(self, drafted: int, accepted: int) -> None:
        if drafted <= 0:
            return
        decay = 1.0 - self.smoothing
        self.accepted = self.accepted * decay + accepted
        self.rejections = self.rejections * decay + (1.0 if accepted < drafted else 0.0)

    def observe_costs(self, draft_seconds: float, max_k_drafted: int, verify_seconds: float) -> None:
        if max_k_drafted > 0:
            self.draft_token_cost = self._ema(self.draft_token_cost, draft_seconds / max_k_drafted)
        self.verify_cost = self._ema(self.verify_cost, verify_seconds)

    def _ema(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)
