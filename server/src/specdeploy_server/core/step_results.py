"""What one step's results do: tokens forced by a grammar, accepted tokens cut at a stop token or a limit,
sequences that finish, the statistics, and outputs handed to their consumers.

A mixin of :class:`~specdeploy_server.core.scheduler.SpeculativeScheduler` (as ``LoadFigures`` is): the
accounting runs for every sequence every step, so it works on the scheduler's own state without copies.
"""

from __future__ import annotations

from collections.abc import Sequence

from specdeploy_server.core.adaptive import DraftLenController
from specdeploy_server.core.drafters import Drafter
from specdeploy_server.core.executors import VerifyRequest
from specdeploy_server.core.logits import fast_forward
from specdeploy_server.core.scheduler_types import (
    GlobalStats,
    SchedulerObserver,
    SchedulerSettings,
    StepSpeculation,
    truncate,
)
from specdeploy_server.core.types import (
    Proposal,
    RequestState,
    SequenceState,
    StepOutput,
    TokenLogprob,
)

RUNNING = RequestState.RUNNING
_MAX_ACCEPTED_BUCKET = 64
#: a step's output not yet handed to its consumer: tokens, drafted, accepted, logprobs
Undelivered = tuple[SequenceState, list[int], int, int, list[TokenLogprob] | None]


def _decoded_accepted(tokens: Sequence[int], req: VerifyRequest) -> tuple[int, int]:
    """Of a verify call's tokens: those decoded after the target's own in the same call
    (``VerifyRequest.extra``: each a step of the target, none a draft token), and the draft tokens
    accepted."""
    decoded = max(len(tokens) - len(req.proposal.tokens) - 1, 0)
    return decoded, (len(tokens) - 1 - decoded if tokens else 0)


class StepResults:
    """Accounts a step's results on the scheduler's state (declared here, owned by the scheduler)."""

    settings: SchedulerSettings
    stats: GlobalStats
    drafter: Drafter
    draft_len: DraftLenController
    observer: SchedulerObserver
    #: outputs of the last step not yet handed to their consumers; whether a flush is queued
    _undelivered: list[Undelivered]
    _flush_queued: bool
    #: sequences that left RUNNING since the last reap
    _ended: list[SequenceState]

    def _fast_forward(self, batch: Sequence[SequenceState]) -> int:
        """Emit the tokens each constrained sequence's grammar forces, without a model step (delivered before
        the step's own tokens); leaves room for the one token the step verifies. Returns how many."""
        total = 0
        max_model_len = self.settings.max_model_len
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
                self.stats.emitted += len(forced)
                self.stats.forced += len(forced)
                self._undelivered.append((seq, forced, 0, 0, None))
                total += len(forced)
        return total

    def _apply(
        self,
        batch: Sequence[SequenceState],
        proposals: Sequence[Proposal],
        requests: Sequence[VerifyRequest],
        emitted: Sequence[Sequence[int]],
        finished: list[tuple[SequenceState, StepOutput]],
    ) -> int:
        """Account one step for every sequence still running; returns the tokens emitted.

        The output of a sequence that ended goes to ``finished``; the others' go to the undelivered (as
        tuples: their StepOutput is built when they are handed over, off the critical path). Runs for every
        sequence every step, so per-step lookups are hoisted out of the loop and the observer hears of the
        step's speculation once, aggregated.
        """
        drafter_observe = self.drafter.observe
        observe_acceptance = self.draft_len.observe_acceptance
        max_model_len = self.settings.max_model_len
        undelivered = self._undelivered
        ended = self._ended
        total = sequence_steps = total_drafted = total_accepted = 0
        accepted_counts = [0] * (_MAX_ACCEPTED_BUCKET + 1)
        for seq, prop, req, tokens in zip(batch, proposals, requests, emitted, strict=True):
            if seq.state is not RUNNING:  # aborted while the step was in flight: its results are dropped
                continue
            decoded, accepted = _decoded_accepted(tokens, req)
            drafter_observe(seq, prop, accepted)
            drafted, accepted = self._drafted_accepted(seq, prop, accepted)
            observe_acceptance(seq.request_id, drafted, accepted)
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
            total += n
            if finish is None:
                undelivered.append((seq, new, drafted, accepted, logprobs))
            else:
                seq.state = RequestState.FINISHED
                seq.finished = finish
                ended.append(seq)
                self.stats.requests_finished += 1
                finished.append((seq, StepOutput(new, finish, drafted, accepted, logprobs)))
        stats = self.stats
        stats.sequence_steps += sequence_steps
        stats.drafted += total_drafted
        stats.accepted += total_accepted
        stats.emitted += total
        if sequence_steps:
            self.observer.on_speculation(
                StepSpeculation(sequence_steps, total_drafted, total_accepted, accepted_counts)
            )
        return total

    def _drafted_accepted(self, seq: SequenceState, prop: Proposal, accepted: int) -> tuple[int, int]:
        """Draft tokens proposed and accepted, not counting the tokens a grammar forced into the draft
        (accepted ones count as forced): acceptance measures the drafter, not the grammar."""
        if not prop.forced:
            return len(prop.tokens), accepted
        forced = sum(1 for i in prop.forced if i < accepted)
        seq.stats.forced += forced
        self.stats.forced += forced
        return len(prop.tokens) - len(prop.forced), accepted - forced

    def _flush(self) -> None:
        """Hand the undelivered outputs to their consumers."""
        self._flush_queued = False
        pending, self._undelivered = self._undelivered, []
        for seq, new, drafted, accepted, logprobs in pending:
            seq.outputs.put_nowait(StepOutput(new, None, drafted, accepted, logprobs))
