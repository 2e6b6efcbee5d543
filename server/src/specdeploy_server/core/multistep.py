"""Multi-step decoding for a lone plain sequence: several target tokens per executor call.

An executor that runs its forwards on another thread (the reference backend) pays a hand-off per call: the
call travels to its worker and the result back to the event loop, two thread wake-ups, about half a
millisecond on the 2-core VM this was measured on, which is an eighth of a small model's step on a CPU. With
speculation a call yields several tokens and the cost is shared; plain decoding of a lone sequence pays it per
token. So when nothing else can use the step — one running sequence, none waiting, no drafter, greedy with
nothing that needs each token's logits (no logits processing, grammar or logprobs) — the target may decode
up to ``extra`` more tokens in the same call (``VerifyRequest.extra``), greedily, stopping at a stop token or
an abort.

How many: as many as fit in ``budget_seconds`` of the measured seconds per token (so a request that arrives
meanwhile waits at most about that long to join the batch, and a model whose forward alone takes longer than
the budget decodes one token per call, as without this), at most ``max_tokens_per_call``, never past the
sequence's ``max_tokens`` or context; never for its first token (the time to first token is unchanged).
Tokens reach the client a call's worth at a time, as a speculative step's do.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specdeploy_server.core.types import SequenceState


@dataclass
class PlainMultiStep:
    budget_seconds: float = 0.025
    max_tokens_per_call: int = 8
    smoothing: float = 0.2
    #: measured seconds of a plain call per token it decoded (None: not measured yet, one token per call)
    seconds_per_token: float | None = None

    def extra(self, batch: Sequence[SequenceState], waiting: int, max_model_len: int) -> int:
        """Tokens the target may decode after the first in this step's call."""
        if len(batch) != 1 or waiting or self.seconds_per_token is None:
            return 0
        seq = batch[0]
        params = seq.params
        if (
            seq.num_generated == 0
            or not params.greedy
            or params.changes_logits
            or params.logprobs is not None
            or seq.constraint is not None
        ):
            return 0
        per_token = self.seconds_per_token
        fits = int(self.budget_seconds / per_token) if per_token > 0 else self.max_tokens_per_call
        room = min(seq.max_tokens - seq.num_generated, max_model_len - len(seq.token_ids))
        return max(0, min(fits, self.max_tokens_per_call, room) - 1)

    def observe(self, tokens: int, seconds: float) -> None:
        """A lone plain call decoded ``tokens`` in ``seconds``."""
        if tokens <= 0:
            return
        per_token = seconds / tokens
        known = self.seconds_per_token
        self.seconds_per_token = per_token if known is None else known + self.smoothing * (per_token - known)
