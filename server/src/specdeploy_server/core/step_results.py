"""What one step's results do: tokens forced by a grammar, accepted tokens cut at a stop token or a limit,
sequences that finish, the statistics; outputs go to the pending ones (``core/delivery.py``) or, for a
sequence that finished, back to the scheduler, which hands them over.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdeploy_server.core.adaptive import DraftLenController
from specdeploy_server.core.delivery import PendingOutputs
from specdeploy_server.core.drafters import Drafter
from specdeploy_server.core.executors import VerifyRequest
from specdeploy_server.core.logits import fast_forward
from specdeploy_server.core.prediction import PredictionDrafter
from specdeploy_server.core.scheduler_types import GlobalStats, StepSpeculation, truncate
from specdeploy_server.core.types import Proposal, RequestState, SequenceState, StepOutput

RUNNING = RequestState.RUNNING
_MAX_ACCEPTED_BUCKET = 64


def _decoded_accepted(tokens: Sequence[int], req: VerifyRequest) -> tuple[int, int]:
    """Of a verify call's tokens: those decoded after the target's own in the same call
    (``VerifyRequest.extra``: each a step of the target, none a draft token), and the draft tokens
    accepted."""
    decoded = max(len(tokens) - len(req.proposal.tokens) - 1, 0)
    return decoded, (len(tokens) - 1 - decoded if tokens else 0)


class StepAccounting:
    """Accounts each step's results on its sequences and on the scheduler's statistics.

    Its collaborators are handed in by the scheduler: the statistics it adds to, the drafter and draft-length
    controller it tells what was accepted, and the pending outputs it adds the outputs of going sequences to.
    """

    def __init__(
        self,
        max_model_len: int,
        stats: GlobalStats,
        drafter: Drafter,
        draft_len: DraftLenController,
        pending: PendingOutputs,
        *,
        predictions: PredictionDrafter | None = None,
    ) -> None:
        self._max_model_len = max_model_len
        self._stats = stats
        self._drafter = drafter
        self._draft_len = draft_len
        self._pending = pending
        #: told what was accepted of the proposals taken from the requests' predictions
        self._predictions = predictions

    def fast_forward(self, batch: Sequence[SequenceState]) -> int:
        """Emit the tokens each constrained sequence's grammar forces, without a model step (delivered before
        the step's own tokens); leaves room for the one token the step verifies. Returns how many."""
        total = 0
        max_model_len = self._max_model_len
        stats, pending = self._stats, self._pending
        for seq in batch:
            if seq.constraint is None or seq.state is not RUNNING:
                continue
            room = min(seq.max_tokens - seq.num_generated, max_model_len - len(seq.token_ids)) - 1
            forced = fast_forward(seq, room)
            if forced:
                seq.token_ids.extend(forced)
                seq.num_generated += len(forced)
                seq.stats.forced += len(forced)
                seq.stats.emitted += len(forced)
                stats.emitted += len(forced)
                stats.forced += len(forced)
                pending.items.append((seq, forced, 0, 0, None, 0))
                total += len(forced)
        return total

    def apply(
        self,
        batch: Sequence[SequenceState],
        proposals: Sequence[Proposal],
        requests: Sequence[VerifyRequest],
        emitted: Sequence[Sequence[int]],
        *,
        finished: list[tuple[SequenceState, StepOutput]],
        ended: list[SequenceState],
    ) -> tuple[int, StepSpeculation | None]:
        """Account one step for every sequence still running; returns the tokens emitted, and the step's
        speculation (None when no sequence was stepped) for the scheduler's observer.

        A sequence that ended is moved to ``FINISHED`` and appended to ``ended`` (the scheduler's, released at
        its next reap), its output to ``finished``; the others' outputs go to the pending outputs. Runs for
        every sequence every step, so per-step lookups are hoisted out of the loop and the speculation is
        reported once per step, aggregated.
        """
        max_model_len = self._max_model_len
        undelivered = self._pending.items
        stats = self._stats
        total = sequence_steps = total_drafted = total_accepted = 0
        accepted_counts = [0] * (_MAX_ACCEPTED_BUCKET + 1)
        for seq, prop, req, tokens in zip(batch, proposals, requests, emitted, strict=True):
            if seq.state is not RUNNING:  # aborted while the step was in flight: its results are dropped
                continue
            decoded, accepted = _decoded_accepted(tokens, req)
            drafted, accepted = self._observed(seq, prop, accepted)
            sequence_steps += 1 + decoded
            if drafted:
                total_drafted += drafted
                total_accepted += accepted
                accepted_counts[min(accepted, _MAX_ACCEPTED_BUCKET)] += 1
            # Tokens up to the first stop token, the max_tokens budget or the context length (at least one: a
            # sequence already at its limit still emits the one it was verified for); the common case (none of
            # them reached) takes all tokens at once.
            new = list(tokens)
            room = max(min(seq.max_tokens - seq.num_generated, max_model_len - len(seq.token_ids)), 1)
            stop_ids = seq.stop_token_ids
            finish = (
                truncate(new, stop_ids, room)
                if len(new) >= room or (stop_ids and not stop_ids.isdisjoint(new))
                else None
            )
            n = len(new)
            # of the prediction's accepted tokens, those kept (not cut at a stop token)
            predicted = min(accepted, n) if prop.from_prediction else 0
            logprobs = req.logprobs[:n] if req.logprobs is not None else None
            if seq.constraint is not None:
                seq.constraint.advance(new)
            seq.token_ids.extend(new)
            seq.num_generated += n
            seq_stats = seq.stats
            seq_stats.steps += 1 + decoded
            seq_stats.drafted += drafted
            seq_stats.accepted += accepted
            seq_stats.emitted += n
            seq_stats.prediction_accepted += predicted
            total += n
            if finish is None:
                undelivered.append((seq, new, drafted, accepted, logprobs, predicted))
            else:
                seq.state = RequestState.FINISHED
                seq.finished = finish
                ended.append(seq)
                stats.requests_finished += 1
                finished.append((seq, StepOutput(new, finish, drafted, accepted, logprobs, predicted)))
        stats.sequence_steps += sequence_steps
        stats.drafted += total_drafted
        stats.accepted += total_accepted
        stats.emitted += total
        if not sequence_steps:
            return total, None
        return total, StepSpeculation(sequence_steps, total_drafted, total_accepted, accepted_counts)

    def _observed(self, seq: SequenceState, prop: Proposal, accepted: int) -> tuple[int, int]:
        """Tell the proposal's drafter what was accepted; returns the draft tokens proposed and accepted. A
        proposal from the request's prediction teaches the deployment's drafter and draft length nothing."""
        if prop.from_prediction:
            if self._predictions is not None:
                self._predictions.observe(seq, prop, accepted)
            drafted, accepted = self._drafted_accepted(seq, prop, accepted)
            seq.stats.prediction_drafted += drafted
            return drafted, accepted
        self._drafter.observe(seq, prop, accepted)
        drafted, accepted = self._drafted_accepted(seq, prop, accepted)
        self._draft_len.observe_acceptance(seq.request_id, drafted, accepted)
        return drafted, accepted

    def _drafted_accepted(self, seq: SequenceState, prop: Proposal, accepted: int) -> tuple[int, int]:
        """Draft tokens proposed and accepted, not counting the tokens a grammar forced into the draft
        (accepted ones count as forced): acceptance measures the drafter, not the grammar."""
        if not prop.forced:
            return len(prop.tokens), accepted
        forced = sum(1 for i in prop.forced if i < accepted)
        seq.stats.forced += forced
        self._stats.forced += forced
        return len(prop.tokens) - len(prop.forced), accepted - forced
