"""What a backend must offer the speculative core.

The two protocols are deliberately the shape TensorRT-LLM's executor has for external draft tokens:

* a draft executor "generates k tokens for this prefix" (optionally returning the distribution of each), and
* a target executor "verifies these draft tokens for this prefix and returns the accepted ones plus one
token of
  its own" (``ExternalDraftTokensConfig(tokens, logits)``).

Calls are batched: one call covers every running sequence, so a backend can run them as one batch (in-flight
batching) or one after another. A backend keeps its own per-sequence state (KV cache) keyed by
``SequenceState.request_id``, and must tolerate the prefix having changed since the last call: after a step
the
prefix is the previous one plus the emitted tokens, so the backend keeps the cache for the longest common
prefix.

The rules every backend follows (the scheduler relies on them, see docs/server.md "Request lifecycle"):

* ``release(request_id)`` frees a request's state. The scheduler calls it only between steps, never while a
  call that includes the request is in flight, and exactly once per request that was ever running.
* ``cancel(request_id)`` (optional, :class:`CancelsInFlight`) is called at once when a running request is
  aborted, possibly while a call including it is in flight: it may stop that work early (TensorRT-LLM:
  ``cancel_request``) but must not free state the call uses. What a call returns for an aborted request is
  ignored.
* A call that fails some requests of its batch raises :class:`RequestErrors` naming them; the others of the
  batch are stepped again. Any other exception cannot be attributed: it fails the requests of that step only
  (never waiting requests, never the server).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from specdeploy_server.core.types import Proposal, SequenceState, TokenLogprob


class ExecutorError(RuntimeError):
    """An executor refused or failed one request (TensorRT-LLM: a response with ``has_error()``)."""

    def __init__(self, executor: str, message: str) -> None:
        super().__init__(f"{executor} executor: {message}")
        self.executor = executor
        self.message = message


class RequestErrors(Exception):
    """Some sequences of a batched call failed, keyed by ``SequenceState.request_id``.

    The scheduler fails only those sequences; the others keep running and are stepped again (nothing of the
    failed step was committed: every step re-sends the whole prefix).
    """

    def __init__(self, errors: dict[str, ExecutorError]) -> None:
        super().__init__("; ".join(str(e) for e in errors.values()))
        self.errors = errors


@runtime_checkable
class CancelsInFlight(Protocol):
    """An executor (or drafter) that can stop the in-flight work of one request early."""

    def cancel(self, request_id: str) -> None: ...


class AcceptanceRule:
    TOKEN_MATCH = "tokenMatch"
    LOGITS = "logits"


@dataclass(frozen=True)
class DraftRequest:
    seq: SequenceState
    num_tokens: int
    want_probs: bool


@dataclass(frozen=True)
class VerifyRequest:
    """Verify ``proposal`` for ``seq``. The executor applies the sequence's logits processing
    (:func:`specdeploy_server.core.logits.target_logits`) before accepting, and, when ``logprobs`` is a
    list (the request asked for logprobs), appends one :class:`TokenLogprob` per token it returns.

    ``extra`` (only with an empty proposal, for a greedy sequence whose tokens need no logits processing,
    grammar or logprobs: :mod:`specdeploy_server.core.multistep`): the executor may decode up to that many
    more tokens after its own, greedily, in the same call, stopping after a stop token or when the sequence
    is aborted; an executor that cannot returns its one token, as always."""

    seq: SequenceState
    proposal: Proposal
    acceptance: str  # AcceptanceRule value
    logprobs: list[TokenLogprob] | None = None
    extra: int = 0


class DraftExecutor(Protocol):
    """A draft model: proposes ``num_tokens`` tokens continuing ``seq.token_ids``."""

    async def draft(self, batch: Sequence[DraftRequest]) -> list[Proposal]: ...

    def release(self, request_id: str) -> None: ...


class TargetExecutor(Protocol):
    """The target model: verifies proposals, returns accepted draft tokens + one target token per sequence."""

    @property
    def max_draft_len(self) -> int: ...

    async def verify(self, batch: Sequence[VerifyRequest]) -> list[list[int]]: ...

    def release(self, request_id: str) -> None: ...


def pads_rows(target: TargetExecutor) -> bool:
    """Whether the backend computes every row of a batched call as wide as the widest (a padded batch: the
    reference backend's verify pass, and its draft passes, which feed padding to the rows that are done),
    declared by ``pads_rows = True`` on the target executor. Then a step costs its batch size times its
    longest draft, whatever the shorter rows draft, and ``draftLen: auto`` plans one length for all rows.
    A packed backend (TensorRT-LLM, the stand-ins) pays for the tokens it is given."""
    return bool(getattr(target, "pads_rows", False))
