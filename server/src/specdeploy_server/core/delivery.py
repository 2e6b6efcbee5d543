"""When a step's outputs reach their consumers: the outputs not handed over yet, and the flush that does it.

The output of a sequence that goes on is not handed to its consumer when its step is accounted: it is kept
(as a tuple: its ``StepOutput`` is built when it is handed over, off the critical path) until the next step's
executor call has been made, so that the consumers' work overlaps the executors' instead of delaying the next
step (``flush_soon``). Whatever must reach a consumer after them (a later step's outputs, a request's last
output) hands them over first (``flush``).
"""

from __future__ import annotations

import asyncio

from specdeploy_server.core.types import SequenceState, StepOutput, TokenLogprob

#: a step's output not yet handed to its consumer: tokens, drafted, accepted, logprobs, of the accepted those
#: from the prediction
Undelivered = tuple[SequenceState, list[int], int, int, list[TokenLogprob] | None, int]


class PendingOutputs:
    """Outputs not yet handed to their consumers, in the order they were produced, and whether a flush of
    them is queued on the event loop."""

    def __init__(self) -> None:
        #: appended to by the step's accounting; handed over, in this order, by ``flush``
        self.items: list[Undelivered] = []
        self._flush_queued = False

    def flush(self) -> None:
        """Hand the pending outputs to their consumers."""
        self._flush_queued = False
        pending, self.items = self.items, []
        for seq, new, drafted, accepted, logprobs, predicted in pending:
            seq.outputs.put_nowait(StepOutput(new, None, drafted, accepted, logprobs, predicted))

    def flush_soon(self) -> None:
        """Queue a flush on the running event loop (``call_soon``) unless nothing is pending or one is queued:
        the outputs reach their consumers once the loop's current task next yields."""
        if self.items and not self._flush_queued:
            self._flush_queued = True
            asyncio.get_running_loop().call_soon(self.flush)
