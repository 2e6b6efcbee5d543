"""Each step's draft lengths with the requests' own speculation settings: a request's cap on its draft length
(0: no speculation for it), and its prediction, which drafts ahead of the deployment's drafter.

A sequence whose prediction proposes this step (core/prediction.py) drafts from it, up to the backend's
largest draft (``TargetExecutor.max_draft_len``) rather than the step's planned length, and the deployment's
drafter drafts nothing for it; one whose prediction proposes nothing (none given, or the output cannot be
placed in it) drafts as planned, from the deployment's drafter.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdeploy_server.core.prediction import PredictionDrafter
from specdeploy_server.core.types import Proposal, SequenceState


class PredictionPlanner:
    def __init__(self) -> None:
        self.drafter = PredictionDrafter()

    def plan(
        self,
        batch: Sequence[SequenceState],
        lengths: Sequence[int],
        max_model_len: int,
        backend_max: int,
    ) -> tuple[list[tuple[SequenceState, int]], dict[int, Proposal]]:
        """``(plan, predicted)``: each sequence's length for the deployment's drafter, clamped so the step
        cannot overshoot max_tokens or the context, and the prediction proposals by batch position."""
        plan: list[tuple[SequenceState, int]] = []
        predicted: dict[int, Proposal] = {}
        for i, (seq, k) in enumerate(zip(batch, lengths, strict=True)):
            room = min(seq.max_tokens - seq.num_generated - 1, max_model_len - len(seq.token_ids) - 1)
            speculation = seq.speculation
            cap = speculation.max_draft_len
            length = k if cap is None else min(k, cap)
            if speculation.prediction:
                limit = min(backend_max, room) if cap is None else min(backend_max, room, cap)
                proposal = self.drafter.propose(seq, limit)
                if proposal is not None:
                    predicted[i] = proposal
                    plan.append((seq, 0))
                    continue
            plan.append((seq, max(0, min(length, room))))
        return plan, predicted
