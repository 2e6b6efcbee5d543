"""Predicted Outputs: draft tokens taken from the request's own prediction of its output.

A prediction is a text the client expects the output to mostly repeat (a file with a small edit, a document
rewritten, JSON with one field changed). The drafter keeps, per request, a cursor into the prediction's
tokens: the position the output has reached in it. Every generated token that equals the prediction's token
at the cursor moves the cursor on; one that does not loses the alignment, and it is found again:

* **Substitution.** Right after the first differing token the drafter guesses that one token was replaced
  and proposes the prediction from the position after it (a changed word, a changed number).
* **Re-alignment.** Otherwise, as prompt lookup does over the prompt, the longest suffix of the output (up to
  ``max_ngram`` tokens) that occurs in the prediction gives the position to continue from: the occurrence
  nearest to where the output left the prediction. That finds the place again after an insertion (the
  output's extra text ends and the prediction's text resumes) and after a deletion (the output skips part of
  the prediction). A short suffix (fewer than ``FAR_NGRAM`` tokens) is trusted only near that place, and
  only while the prediction's last draft was not a miss.

A proposal is the prediction from the cursor on, up to the length the caller allows (the backend's largest
draft, not the deployment's usual draft length: proposing costs nothing) and the request's current window:
the window doubles after a proposal accepted whole and shrinks after a rejection, so a prediction that keeps
being rejected costs short drafts only (down to one token after proposals of which nothing was accepted).
After such a miss, re-alignment needs two tokens more of evidence per miss in a row (an unrelated prediction
soon proposes nothing: its short n-grams match any text, its long ones do not), and no guess is made; an
accepted token resets that.

The proposal is deterministic (a point mass on each token): acceptance treats it as a one-hot draft, which
keeps greedy output identical and sampled output distributed exactly as without a prediction.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, field

from specdeploy_server.core.types import Proposal, SequenceState

#: the longest output suffix matched against the prediction when re-aligning
MAX_NGRAM = 8
#: suffixes shorter than this are trusted only within NEAR tokens of where the output left the prediction
FAR_NGRAM = 3
NEAR = 64
#: a request's first proposal window (its opening draft: what an unrelated prediction costs before it backs
#: off; a prediction that holds doubles it with every proposal accepted whole), and the least a partly
#: accepted proposal shrinks it to
INITIAL_WINDOW = 4
MIN_WINDOW = 4


@dataclass
class PredictionAlignment:
    """One request's prediction, its n-gram index and where the output stands in it."""

    tokens: list[int]
    max_ngram: int = MAX_NGRAM
    #: the prediction position the output has reached (None: the output has left the prediction)
    cursor: int | None = 0
    #: where the output left the prediction (the position after the differing token)
    hint: int = 0
    #: generated tokens walked so far
    seen: int = 0
    window: int = INITIAL_WINDOW
    #: consecutive proposals of which nothing was accepted
    misses: int = 0
    _index: dict[tuple[int, ...], list[int]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        tokens = self.tokens
        for end in range(1, len(tokens)):  # an n-gram ending at `end` with a continuation after it
            for n in range(1, min(self.max_ngram, end) + 1):
                self._index.setdefault(tuple(tokens[end - n : end]), []).append(end)

    def position(self, generated: Sequence[int]) -> int | None:
        """Where in the prediction the output continues, after walking the tokens generated since the last
        call; None when the output cannot be placed in it."""
        tokens = self.tokens
        lost_now = False
        for token in generated[self.seen :]:
            cursor = self.cursor
            if cursor is not None and cursor < len(tokens) and tokens[cursor] == token:
                self.cursor = cursor + 1
                lost_now = False
            elif cursor is None and self.hint < len(tokens) and tokens[self.hint] == token:
                self.cursor = self.hint + 1  # the guessed place was right
                lost_now = False
            else:
                if cursor is not None:
                    self.hint = cursor + 1
                self.cursor = None
                lost_now = True
        self.seen = len(generated)
        if self.cursor is not None:
            return self.cursor
        found = self._realign(generated)
        if found is not None:
            self.cursor = found
            return found
        if lost_now and not self.misses:
            return self.hint  # a guess: one token was replaced (the cursor stays lost until it is confirmed)
        return None

    def _realign(self, generated: Sequence[int]) -> int | None:
        hint = self.hint
        doubt = 2 * self.misses  # two tokens more of evidence per miss in a row
        least = 1 + doubt
        for n in range(min(self.max_ngram, len(generated)), least - 1, -1):
            ends = self._index.get(tuple(generated[len(generated) - n :]))
            if not ends:
                continue
            at = bisect_left(ends, hint)
            candidates = [ends[i] for i in (at - 1, at) if 0 <= i < len(ends)]
            best = min(candidates, key=lambda end: (abs(end - hint), end < hint))
            if n >= FAR_NGRAM + doubt or (not doubt and abs(best - hint) <= NEAR):
                return best
        return None

    def observe(self, proposed: int, accepted: int, limit: int) -> None:
        """A proposal of ``proposed`` tokens had ``accepted`` accepted; ``limit`` is the most it could have
        had."""
        if accepted >= proposed:
            self.window = min(max(self.window * 2, MIN_WINDOW), max(limit, MIN_WINDOW))
        elif accepted:
            self.window = max(MIN_WINDOW, accepted + 1)
        else:
            self.window = max(1, self.window // 4)
        self.misses = 0 if accepted else self.misses + 1


class PredictionDrafter:
    """Proposes each request's prediction (``SequenceState.speculation.prediction``) as its draft."""

    def __init__(self, max_ngram: int = MAX_NGRAM) -> None:
        self.max_ngram = max_ngram
        self._alignments: dict[str, PredictionAlignment] = {}
        self._limits: dict[str, int] = {}

    def propose(self, seq: SequenceState, limit: int) -> Proposal | None:
        """The prediction's tokens from where the output stands in it, at most ``limit`` of them; None when
        the request has no prediction or the output cannot be placed in it (the deployment's drafter
        drafts then)."""
        prediction = seq.speculation.prediction
        if not prediction or limit <= 0:
            return None
        alignment = self._alignments.get(seq.request_id)
        if alignment is None:
            alignment = PredictionAlignment(list(prediction), self.max_ngram)
            self._alignments[seq.request_id] = alignment
        start = alignment.position(seq.generated_ids)
        if start is None or start >= len(alignment.tokens):
            return None
        tokens = alignment.tokens[start : start + min(limit, alignment.window)]
        self._limits[seq.request_id] = limit
        return Proposal(tokens, from_prediction=True)

    def observe(self, seq: SequenceState, proposal: Proposal, num_accepted: int) -> None:
        alignment = self._alignments.get(seq.request_id)
        if alignment is not None:
            limit = self._limits.get(seq.request_id, len(proposal.tokens))
            alignment.observe(len(proposal.tokens), num_accepted, limit)

    def release(self, request_id: str) -> None:
        self._alignments.pop(request_id, None)
        self._limits.pop(request_id, None)
