"""Plain data types shared by the speculative core, the backends and the serving layer."""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]


class FinishReason(enum.StrEnum):
    STOP = "stop"  # end-of-sequence token or a stop string
    LENGTH = "length"  # max_tokens or the model's context length
    ABORT = "abort"  # cancelled (client went away, shutdown)


class RequestState(enum.Enum):
    """Where a request is in its life; only the scheduler moves it (waiting -> running -> one of the rest).

    ``FINISHED``, ``ABORTED`` and ``FAILED`` are terminal: the request's consumer has had its last output
    (a finish reason, an abort, or an exception) and the request no longer counts as load. Its executor state
    is released by the scheduler between steps, never while a step that includes it is in flight.
    """

    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"  # stop token, max_tokens or the context length
    ABORTED = "aborted"  # the consumer went away (disconnect, stop string) or the server drained
    FAILED = "failed"  # the backend failed it (the consumer got the exception)

    @property
    def live(self) -> bool:
        return self is RequestState.WAITING or self is RequestState.RUNNING


class TokenConstraint(Protocol):
    """A grammar over one sequence's generated tokens, with a current state.

    The scheduler moves the state on (``take_forced``, ``advance``); the other methods look ahead along a
    draft and leave the state as it was.
    """

    def allowed_prefix(self, tokens: Sequence[int]) -> int:
        """How many of ``tokens``, from the current state, the grammar allows one after another (an
        end-of-sequence token it allows counts, and ends the look-ahead)."""
        ...

    def masks(self, draft: Sequence[int], vocab_size: int) -> BoolArray:
        """``(len(draft) + 1, vocab_size)``: the tokens allowed after each prefix of ``draft`` (which the
        grammar allows). Every row allows at least one token."""
        ...

    def take_forced(self, limit: int) -> list[int]:
        """Consume and return up to ``limit`` tokens that are the only token the grammar allows at their
        position (never an end-of-sequence token)."""
        ...

    def advance(self, tokens: Sequence[int]) -> None:
        """Consume tokens the sequence emitted (an end-of-sequence token ends the grammar)."""
        ...

    def forced_after(self, prefix: Sequence[int], limit: int) -> list[int] | None:
        """The tokens (up to ``limit``) the grammar forces after ``prefix`` (from the current state, which
        is left as it was); None when it does not allow ``prefix``."""
        ...


@dataclass(frozen=True)
class SamplingParams:
    """How the target picks tokens. ``temperature == 0`` means greedy (argmax).

    Penalties and ``logit_bias`` change the target's logits (so they change the distribution plain decoding
    samples from, and its argmax); ``top_k``, ``top_p`` and ``min_p`` filter the distribution after the
    temperature (see :mod:`specdeploy_server.core.logits`).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    presence_penalty: float = 0.0  # OpenAI: minus this for every token already generated
    frequency_penalty: float = 0.0  # OpenAI: minus this times the token's count in the generated text
    repetition_penalty: float = 1.0  # CTRL/HF: logits of prompt or generated tokens divided (>0) or scaled
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    #: report the target's log-probability of each emitted token and this many alternatives (None: none)
    logprobs: int | None = None
    #: the sequence's stop tokens (end of sequence, ``stop_token_ids``) are masked out of the target's logits
    #: while fewer than this many tokens were generated (vLLM's ``min_tokens``)
    min_tokens: int = 0
    #: tokens that end the sequence besides the model's end-of-sequence tokens (``stop_token_ids``)
    stop_token_ids: frozenset[int] = frozenset()
    #: the model's end-of-sequence tokens do not end the sequence (``ignore_eos``)
    ignore_eos: bool = False

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def changes_logits(self) -> bool:
        """Whether anything changes the target's logits before temperature and filtering."""
        return self.penalises or self.min_tokens > 0

    @property
    def penalises(self) -> bool:
        """Whether penalties or ``logit_bias`` change the target's logits."""
        return bool(
            self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
            or self.logit_bias
        )

    def stops(self, eos_token_ids: frozenset[int]) -> frozenset[int]:
        """The tokens that end a sequence sampled with these settings, given the model's end-of-sequence
        tokens."""
        return (frozenset() if self.ignore_eos else eos_token_ids) | self.stop_token_ids


@dataclass(frozen=True)
class TokenLogprob:
    """The target's log-probability of one token (log-softmax of its raw logits) and the top alternatives."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class Proposal:
    """Draft tokens for one sequence, optionally with the (processed) draft distribution of each.

    ``probs`` has shape ``(len(tokens), vocab)`` when present: row i is the distribution token i was
    sampled from.
    ``None`` means a deterministic proposal (prompt lookup, greedy draft): acceptance treats it as one-hot.
    """

    tokens: list[int]
    probs: FloatArray | None = None
    #: backend-native draft logits handed back to the same backend's target executor (TensorRT-LLM: the
    #: draft request's generation logits, ``[len(tokens), vocab]``, for ``ExternalDraftTokensConfig``)
    native_logits: object | None = None
    #: draft tokens the sequence's grammar forbids, cut before verification (they count as drafted and
    #: rejected). When ``probs`` has a row for the first of them (a sampled draft), rejection sampling draws
    #: the token at that position from the residual ``max(p - q, 0)``, as verifying it would have.
    cut: int = 0
    #: positions of tokens the grammar forced, put into the draft by the drafter rather than drafted
    #: (one-hot rows in ``probs``); the target accepts them with certainty, and they count as forced, not as
    #: drafted and accepted
    forced: tuple[int, ...] = ()
    #: the tokens come from the request's own prediction (core/prediction.py), not the deployment's drafter
    from_prediction: bool = False


EMPTY_PROPOSAL = Proposal(tokens=[])


@dataclass(frozen=True)
class RequestSpeculation:
    """What one request asks of speculation: its prediction (Predicted Outputs, target token ids) and a cap
    on its draft length (0: no speculation for it, None: the deployment's)."""

    prediction: tuple[int, ...] = ()
    max_draft_len: int | None = None


NO_REQUEST_SPECULATION = RequestSpeculation()


@dataclass
class SeqStats:
    """Speculation statistics of one request."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    #: tokens the grammar forced, emitted without a model step (part of ``emitted``)
    forced: int = 0
    #: of ``drafted`` and ``accepted``: those proposed from the request's prediction
    prediction_drafted: int = 0
    prediction_accepted: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


@dataclass
class StepOutput:
    """What one scheduler step produced for one request."""

    token_ids: list[int]
    finish_reason: FinishReason | None
    drafted: int
    accepted: int
    #: one per token of ``token_ids`` when the request asked for logprobs
    logprobs: list[TokenLogprob] | None = None
    #: of the ``accepted`` draft tokens (the first tokens of ``token_ids``), those from the prediction
    prediction_accepted: int = 0


@dataclass(eq=False)
class SequenceState:
    """One request inside the scheduler. Executors read it; only the scheduler mutates it."""

    request_id: str
    prompt_ids: list[int]
    max_tokens: int
    params: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: frozenset[int] = frozenset()
    #: the grammar the generated tokens must follow (structured output), advanced by the scheduler
    constraint: TokenConstraint | None = None
    #: the request's prediction and speculation cap
    speculation: RequestSpeculation = NO_REQUEST_SPECULATION
    # prompt + generated tokens, the prefix every executor works on
    token_ids: list[int] = field(default_factory=list)
    num_generated: int = 0
    state: RequestState = RequestState.WAITING
    #: the finish reason the consumer was given (None while live; ABORT for aborted and failed requests)
    finished: FinishReason | None = None
    stats: SeqStats = field(default_factory=SeqStats)
    arrival: float = field(default_factory=time.monotonic)
    rng: np.random.Generator = field(init=False)
    outputs: asyncio.Queue[StepOutput | BaseException] = field(default_factory=asyncio.Queue)

    def __post_init__(self) -> None:
        if not self.token_ids:
            self.token_ids = list(self.prompt_ids)
        self.rng = np.random.default_rng(self.params.seed)

    @property
    def cancelled(self) -> bool:
        """Aborted (or otherwise over): executors need not finish work for it, nothing of it will be used."""
        return not self.state.live

    @property
    def generated_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_ids) :]

    @property
    def remaining_tokens(self) -> int:
        return max(self.max_tokens - self.num_generated, 0)
