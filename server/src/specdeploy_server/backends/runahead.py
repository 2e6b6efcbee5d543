"""Run-ahead for a lone greedy request: its next forward pass starts as soon as a step's tokens are known.

With one request running, the reference backend's worker thread would otherwise sit idle while the step's
result travels back to the event loop, the scheduler accounts the step and plans the next, and the next call
travels to the worker (two thread wake-ups, which a loaded machine makes slow). Greedy decoding needs nothing
from the loop to know what the next pass starts with: the sequence plus the tokens just emitted. So, right
after answering a verify call for a lone greedy request, the worker feeds the step's last token to the target
(the first position the next call would compute) and keeps its logits. The next call for that request, when
its sequence is exactly what was fed, takes the logits from there:

* no proposal: the token is their argmax, no forward pass at all;
* a proposal (prompt lookup) whose first token is not that argmax: it is rejected outright (token match), the
  argmax is the step's token, no forward pass either;
* a proposal whose first token is that argmax: one pass over the proposal's tokens gives the other rows.

The logits are those of the pass the call would have made (the same cache, the same token fed alone), so
greedy output is unchanged. The run-ahead is skipped where it would be wasted or wrong: several requests
running, sampling or logits processing or a grammar or logprobs, the request's budget used up, a stop token
emitted. The last case above costs a second pass (the token fed alone, then the proposal), where one pass
over both would do: while more than ``MAX_FIRST_MATCH`` of a request's recent proposals (a moving average)
begin with the target's own token, as prompt lookup's do on repetitive text, that request is not run ahead.

The factory builds the executor with run-ahead for prompt lookup only, where it saves the passes over
rejected proposals. Plain decoding would only move its pass earlier, and on CPU that pass and the event loop's
work share the interpreter lock, so the overlap measured slower than none; a draft model shares the worker,
and its proposals mostly begin with the target's own token.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from specdeploy_server.backends.kvbatch import CachedModel, PaddedBatch
from specdeploy_server.core.executors import VerifyRequest
from specdeploy_server.core.types import SequenceState

log = logging.getLogger(__name__)


@dataclass
class _Ahead:
    request_id: str
    tokens: list[int]  # the sequence fed: its last position's logits are kept
    logits: torch.Tensor  # float32, CPU: what the target predicts after ``tokens``


def eligible(req: VerifyRequest) -> bool:
    """Plain greedy token matching: the step's token is the argmax of the raw logits."""
    seq = req.seq
    params = seq.params
    return params.greedy and not params.changes_logits and seq.constraint is None and req.logprobs is None


#: run a request ahead only while at most this share of its recent proposals began with the target's token
MAX_FIRST_MATCH = 0.2
#: weight of the latest proposal in that moving average
MATCH_SMOOTHING = 0.1


class RunAhead:
    """The one run-ahead result of a target executor (used and replaced on its worker thread only)."""

    def __init__(self, model: CachedModel) -> None:
        self.model = model
        self._ahead: _Ahead | None = None
        self._matches: tuple[str, float] = ("", 0.0)  # a request, and how often its proposals began right
        self.used = 0  # calls answered from a run-ahead
        self.passes = 0  # run-ahead passes made

    @torch.inference_mode()
    def take(self, req: VerifyRequest) -> torch.Tensor | None:
        """The verify call's logits rows (one per proposal token, plus one) from the run-ahead, or None when
        there is none for exactly this sequence."""
        ahead, self._ahead = self._ahead, None
        seq = req.seq
        if ahead is None or ahead.request_id != seq.request_id or ahead.tokens != seq.token_ids:
            return None
        first = ahead.logits[None]
        draft = req.proposal.tokens
        self.used += 1
        if not draft:
            return first
        if int(first[0].argmax()) != draft[0]:  # rejected at once: the rows after the first go unread
            return first.expand(len(draft) + 1, -1)
        rows = PaddedBatch(self.model, [(seq.request_id, [*seq.token_ids, *draft], len(draft))])
        rest = rows.run()[0]
        rows.commit()
        return torch.cat([first, rest])

    def plan(self, req: VerifyRequest, emitted: list[int]) -> list[int] | None:
        """The sequence to run ahead on after this call emitted ``emitted`` (a copy: the scheduler extends
        the request's own list on the loop thread meanwhile), or None when no step will follow it or running
        ahead does not pay for this request."""
        seq = req.seq
        draft = req.proposal.tokens
        request_id, matches = self._matches
        if request_id != seq.request_id:
            matches = 0.0
        if draft and emitted:
            matches += MATCH_SMOOTHING * (float(emitted[0] == draft[0]) - matches)
        self._matches = (seq.request_id, matches)
        if matches > MAX_FIRST_MATCH or seq.cancelled or not emitted:
            return None
        if seq.num_generated + len(emitted) >= seq.max_tokens or emitted[-1] in seq.stop_token_ids:
            return None
        return [*seq.token_ids, *emitted]

    @torch.inference_mode()
    def run(self, seq: SequenceState, tokens: list[int]) -> None:
        """Feed the last of ``tokens`` after the request's cache and keep its logits (on the worker thread,
        after the call that planned it has answered)."""
        if seq.cancelled:
            return
        try:
            batch = PaddedBatch(self.model, [(seq.request_id, tokens, 1)])
            logits = batch.run()[0][-1]
            batch.commit()
        except Exception:  # the call it stands for will make the pass itself, and report what fails
            log.debug("run-ahead for request %s failed", seq.request_id, exc_info=True)
            return
        self.passes += 1
        self._ahead = _Ahead(seq.request_id, tokens, logits)

    def release(self, request_id: str) -> None:
        if self._ahead is not None and self._ahead.request_id == request_id:
            self._ahead = None
