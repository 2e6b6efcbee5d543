"""The draft and target executors of backend ``trtllm-engine``: each step's requests to the TensorRT-LLM
executors (``tensorrt_llm.bindings.executor``), as TensorRT-LLM's own draft-target loop makes them:

* draft: ``Request(prefix, max_tokens=k)``, returning generation logits when acceptance is by logits;
* target: ``Request(prefix, max_tokens=k + 1, external_draft_tokens_config=ExternalDraftTokensConfig(tokens,
  logits))``; its output starts with the accepted draft tokens, then one token of the target's own. How many
  were accepted is counted as TensorRT-LLM's own loop counts it: by comparing the output with the draft,
  position by position (prefix match), not from the output's length; anything after the target's own token
  (an executor that keeps decoding up to ``max_tokens``) is dropped, so a step is always accepted + 1.

Every step is a new request carrying the whole prefix; KV block reuse (engines built with paged context FMHA)
makes that cheap. Cancelling a sequence cancels its executor requests still in flight (``cancel_request``);
requests already answered as final are forgotten at once, and nothing is cancelled once the executor is shut
down.

Draft logits are the draft engine's generation logits, as wide as its padded vocabulary (``vocab_size``
rounded up to a multiple of its tp x pp); the target wants its own padded width. A wider draft row is cut to
the target's width (the extra columns are padding); a narrower one is refused at start-up (``engine_config``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specdeploy_server.backends.trtllm_executor_client import ExecutorClient
from specdeploy_server.core.acceptance import accepted_prefix
from specdeploy_server.core.executors import (
    AcceptanceRule,
    DraftRequest,
    ExecutorError,
    RequestErrors,
    VerifyRequest,
)
from specdeploy_server.core.types import Proposal, SequenceState

_END_ID = "END_ID"  # FinishReason name


# --------------------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class RequestFactory:
    """Builds bindings Requests for one model."""

    bindings: Any
    end_id: int
    pad_id: int
    #: the target's padded vocabulary: draft logits rows are cut to it (None: handed over as they are)
    logits_width: int | None = None

    def sampling(self, seq: SequenceState, greedy: bool) -> Any:
        b = self.bindings
        if greedy:
            return b.SamplingConfig(beam_width=1, top_k=1)
        params = seq.params
        # A fresh seed per request from the sequence's generator: reproducible under a user seed, and
        # independent from step to step (re-using one seed each step would correlate the draws).
        return b.SamplingConfig(
            beam_width=1,
            temperature=params.temperature,
            top_p=params.top_p,
            seed=int(seq.rng.integers(0, 2**63 - 1)),
        )

    def request(
        self,
        seq: SequenceState,
        max_tokens: int,
        *,
        greedy: bool,
        return_logits: bool = False,
        draft: Proposal | None = None,
        use_logits: bool = False,
    ) -> Any:
        b = self.bindings
        external = None
        if draft is not None and draft.tokens:  # the bindings refuse an empty draft
            logits = None
            if use_logits and draft.native_logits is not None:
                logits = self.draft_logits(draft.native_logits, len(draft.tokens))
            external = b.ExternalDraftTokensConfig(list(draft.tokens), logits)
        return b.Request(
            input_token_ids=list(seq.token_ids),
            max_tokens=max_tokens,
            streaming=False,
            sampling_config=self.sampling(seq, greedy),
            output_config=b.OutputConfig(
                return_generation_logits=return_logits, exclude_input_from_output=True
            ),
            end_id=self.end_id,
            pad_id=self.pad_id,
            external_draft_tokens_config=external,
        )

    def draft_logits(self, logits: Any, num_tokens: int) -> Any:
        """``[num_tokens, vocab]`` draft logits as the target takes them: one row per draft token, columns cut
        to the target's padded vocabulary (those beyond it are the draft engine's own padding)."""
        rows = logits[:num_tokens]
        if self.logits_width is not None and rows.shape[-1] > self.logits_width:
            rows = rows[:, : self.logits_width]
        return rows


def _raise_failures(name: str, failures: dict[str, str]) -> None:
    if failures:
        raise RequestErrors({seq: ExecutorError(name, message) for seq, message in failures.items()})


class TrtDraftExecutor:
    """DraftExecutor over a draft engine: one request of ``max_tokens = k`` per sequence."""

    def __init__(self, client: ExecutorClient, requests: RequestFactory) -> None:
        self.client = client
        self.requests = requests

    async def draft(self, batch: Sequence[DraftRequest]) -> list[Proposal]:
        # Draft tokens are sampled from the (processed) draft distribution only when acceptance is by
        # logits; otherwise they are the draft's argmax, as in the reference backend.
        sample = [r.want_probs and not r.seq.params.greedy for r in batch]
        outcomes = await self.client.run(
            [
                (
                    r.seq.request_id,
                    self.requests.request(r.seq, r.num_tokens, greedy=not s, return_logits=s),
                )
                for r, s in zip(batch, sample, strict=True)
            ]
        )
        proposals: list[Proposal] = []
        failures: dict[str, str] = {}
        for r, s, outcome in zip(batch, sample, outcomes, strict=True):
            if outcome.error is not None and not (outcome.cancelled or r.seq.cancelled):
                failures[r.seq.request_id] = outcome.error
            tokens = outcome.tokens[: r.num_tokens]
            logits = None
            if s and outcome.logits is not None and tokens:
                logits = outcome.logits[0][: len(tokens)]  # beam 0: [tokens, vocab]
            proposals.append(Proposal(tokens, native_logits=logits))
        _raise_failures(self.client.name, failures)
        return proposals

    def cancel(self, request_id: str) -> None:  # CancelsInFlight: an aborted request's executor requests
        self.client.cancel(request_id)

    def release(self, request_id: str) -> None:
        self.client.cancel(request_id)


class TrtTargetExecutor:
    """TargetExecutor over the target engine: verifies external draft tokens
    (``ExternalDraftTokensConfig``)."""

    def __init__(self, client: ExecutorClient, requests: RequestFactory, max_draft_len: int) -> None:
        self.client = client
        self.requests = requests
        self._max_draft_len = max_draft_len

    @property
    def max_draft_len(self) -> int:
        return self._max_draft_len

    async def verify(self, batch: Sequence[VerifyRequest]) -> list[list[int]]:
        outcomes = await self.client.run(
            [
                (
                    r.seq.request_id,
                    self.requests.request(
                        r.seq,
                        len(r.proposal.tokens) + 1,
                        greedy=r.seq.params.greedy,
                        draft=r.proposal,
                        use_logits=r.acceptance == AcceptanceRule.LOGITS and not r.seq.params.greedy,
                    ),
                )
                for r in batch
            ]
        )
        emitted: list[list[int]] = []
        failures: dict[str, str] = {}
        end_id = self.requests.end_id
        for r, outcome in zip(batch, outcomes, strict=True):
            if outcome.cancelled or r.seq.cancelled:
                emitted.append([])  # the scheduler drops cancelled sequences; nothing to account
                continue
            if outcome.error is not None:
                failures[r.seq.request_id] = outcome.error
                emitted.append([])
                continue
            # The accepted draft tokens and the target's own next token; the scheduler counts len - 1 of them
            # as accepted, so anything the executor returned beyond (it kept decoding) is not handed on.
            keep = accepted_prefix(r.proposal.tokens, outcome.tokens) + 1
            tokens = outcome.tokens[:keep]
            ended = len(outcome.tokens) <= keep and outcome.finish == _END_ID
            if ended and (not tokens or tokens[-1] != end_id):
                tokens.append(end_id)  # the sequence ended: make the stop visible to the scheduler
            if not tokens:
                failures[r.seq.request_id] = (
                    f"no output token (finish reason {outcome.finish}) for a prefix of {len(r.seq.token_ids)}"
                )
            emitted.append(tokens)
        _raise_failures(self.client.name, failures)
        return emitted

    def cancel(self, request_id: str) -> None:  # CancelsInFlight: an aborted request's executor requests
        self.client.cancel(request_id)

    def release(self, request_id: str) -> None:
        self.client.cancel(request_id)
