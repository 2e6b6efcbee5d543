"""Load figures of one replica, the inputs of its autoscaling signals (no HTTP, no backend)."""

from __future__ import annotations

import math


class ThroughputMeter:
    """Tokens emitted per second of busy time, over about the last ``window_seconds`` of busy time.

    Tokens and busy seconds are kept as two exponentially decayed sums and the rate is their ratio, so a
    step weighs in proportion to its duration (a ratio of sums, not a mean of per-step ratios). The decay
    runs on busy time only: an idle replica keeps the rate it last measured instead of drifting to zero.
    What counts as a token is the caller's choice; the scheduler feeds it the tokens each step *emitted*
    (accepted draft tokens + one of the target's own per sequence), so a better-accepted draft shows as a
    higher rate.
    """

    def __init__(self, window_seconds: float = 10.0) -> None:
        if not window_seconds > 0:
            raise ValueError("window_seconds must be positive")
        self.window_seconds = window_seconds
        self._tokens = 0.0
        self._seconds = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        """Account ``tokens`` produced in ``seconds`` of busy time (ignored unless ``seconds`` > 0)."""
        if not seconds > 0:
            return
        decay = math.exp(-seconds / self.window_seconds)
        self._tokens = self._tokens * decay + tokens
        self._seconds = self._seconds * decay + seconds

    @property
    def rate(self) -> float | None:
        """Tokens per busy second; None until some tokens were observed."""
        if self._tokens <= 0 or self._seconds <= 0:
            return None
        return self._tokens / self._seconds
