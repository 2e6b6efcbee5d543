"""Latency-controlled stand-in executors and a character tokenizer, for tests and benchmarks.

The stand-ins model a GPU executor. By default a batch runs in a fixed time: a draft call takes
``k * draft_token_seconds`` and a verify call ``verify_seconds``, whatever the batch size, and the target
accepts each draft token independently with probability ``alpha``. Given a :class:`StepTimeModel` and an
:class:`AcceptanceModel` (``backends.step_costs``; :func:`preset_engine` takes a whole preset) a call's time
depends on the tokens in the batch (memory-bound below a knee, compute-bound above) and each prompt gets
its own alpha.

Acceptance is seeded per prompt and position, not drawn from one stream: a prompt's alpha is a function of
the seed and the prompt's tokens, and whether a draft token at output position p is accepted is a function
of the seed, the prompt and p (a uniform draw below alpha). So two runs that serve the same prompts — a fixed
draft length and ``draftLen: auto``, say — meet the same acceptance, position by position, whatever draft
lengths they choose: a comparison between them is not a comparison between two samples of the acceptance.

A call lasts its nominal time, measured on the monotonic clock from the moment it is made, and no longer:
the results are computed first, then the call waits until its deadline — an event-loop timer for the bulk
(the loop stays free for other tasks, as while a GPU works), then a short spin for the last
``SPIN_SECONDS``, because loop timers fire up to a millisecond late and a thread hop plus ``time.sleep``
overshoots by 0.1-0.8 ms on a loaded machine. That overshoot would be an artifact of the test double,
charged to the scheduler it is meant to measure.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter
from collections.abc import AsyncGenerator, Sequence
from typing import Any

from specdeploy_server.backends.step_costs import AcceptanceModel, SpeculationPreset, StepTimeModel
from specdeploy_server.core.drafters import Drafter, DraftModelDrafter, NoDrafter
from specdeploy_server.core.executors import DraftRequest, VerifyRequest
from specdeploy_server.core.scheduler import GlobalStats, SchedulerSettings, SpeculativeScheduler
from specdeploy_server.core.types import (
    NO_REQUEST_SPECULATION,
    FinishReason,
    Proposal,
    RequestSpeculation,
    SamplingParams,
    SeqStats,
    SequenceState,
    StepOutput,
    TokenConstraint,
)
from specdeploy_server.engine import Engine, Generation, ModelInfo, model_info
from specdeploy_server.tokenizer import Tokenizer


class CharTokenizer:
    """One token per character (ids are code points); token 0 is end-of-sequence."""

    eos_token_ids = frozenset({0})
    max_chars_per_token: int | None = 1
    supports_tools = False

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(t) for t in token_ids if t > 0 or not skip_special_tokens)

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
        return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"


_MASK = (1 << 64) - 1


def seeded_uniform(key: int, position: int) -> float:
    """A uniform draw in [0, 1) that is a function of ``(key, position)`` only (splitmix64's finaliser)."""
    x = (key + (position + 1) * 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return (x ^ (x >> 31)) / 18446744073709551616.0


SPIN_SECONDS = 0.0015  # the tail of each wait that is spun rather than left to an event-loop timer


async def wait_until(deadline: float) -> None:
    """Return at ``deadline`` (a ``time.perf_counter()`` value), precisely: a timer, then a spin.

    A deadline already past returns at once, without suspending.
    """
    remaining = deadline - time.perf_counter()
    if remaining <= 0:
        return
    if remaining > SPIN_SECONDS:
        await asyncio.sleep(remaining - SPIN_SECONDS)
    while time.perf_counter() < deadline:
        pass


class StandInTarget:
    def __init__(
        self,
        verify_seconds: float,
        alpha: float,
        seed: int = 0,
        vocab: Sequence[int] = tuple(range(97, 123)),
        max_draft_len: int = 16,
        *,
        time_model: StepTimeModel | None = None,
        acceptance: AcceptanceModel | None = None,
    ) -> None:
        self.verify_seconds = verify_seconds
        self.alpha = alpha
        #: seconds of a verify call over n tokens; default: ``verify_seconds`` whatever n
        self.time_model = time_model or StepTimeModel(verify_seconds)
        self.acceptance = acceptance or AcceptanceModel(alpha)
        self.vocab = list(vocab)
        self.seed = seed
        self._rng = random.Random(seed)  # the bonus tokens' stream
        self._requests: dict[str, tuple[int, float]] = {}  # request id -> (its prompt's key, its alpha)
        #: emitted tokens by the alpha of the prompt that emitted them (what a window of a benchmark served)
        self.emitted_by_alpha: Counter[float] = Counter()
        self._max_draft_len = max_draft_len
        self.calls = 0
        self.busy_seconds = 0.0  # time spent inside verify(), as an executor's latency would be measured
        self.modelled_seconds = 0.0  # the time model's durations of the calls (no host overhead in it)
        self.seen: list[set[str]] = []  # request ids per verify call
        self.released: set[str] = set()

    @property
    def max_draft_len(self) -> int:
        return self._max_draft_len

    async def verify(self, batch: Sequence[VerifyRequest]) -> list[list[int]]:
        self.calls += 1
        self.seen.append({r.seq.request_id for r in batch})
        started = time.perf_counter()
        choice = self._rng.choice
        vocab = self.vocab
        emitted = self.emitted_by_alpha
        out = []
        tokens = 0
        for req in batch:
            seq = req.seq
            key, alpha = self._request(seq)
            tokens += len(req.proposal.tokens) + 1
            accepted: list[int] = []
            position = len(seq.token_ids)  # the first draft token's position in prompt + output
            for i, token in enumerate(req.proposal.tokens):
                if seeded_uniform(key, position + i) >= alpha:
                    break
                accepted.append(token)
            accepted.append(choice(vocab))
            emitted[alpha] += len(accepted)
            out.append(accepted)
        duration = self.time_model.seconds(tokens)
        self.modelled_seconds += duration
        await wait_until(started + duration)
        self.busy_seconds += time.perf_counter() - started
        return out

    def _request(self, seq: SequenceState) -> tuple[int, float]:
        """(the key of the request's prompt, its alpha): functions of the seed and the prompt's tokens."""
        known = self._requests.get(seq.request_id)
        if known is None:
            key = hash((self.seed, tuple(seq.prompt_ids))) & _MASK
            alpha = (
                self.acceptance.draw(random.Random(key))
                if self.acceptance.concentration is not None
                else self.alpha
            )
            known = self._requests[seq.request_id] = (key, alpha)
        return known

    def alpha_of(self, seq: SequenceState) -> float:
        """The acceptance probability of ``seq``'s draft tokens."""
        return self._request(seq)[1]

    def release(self, request_id: str) -> None:
        self.released.add(request_id)
        self._requests.pop(request_id, None)


class StandInDraft:
    def __init__(
        self,
        token_seconds: float,
        seed: int = 1,
        vocab: Sequence[int] = tuple(range(97, 123)),
        time_model: StepTimeModel | None = None,
    ) -> None:
        self.token_seconds = token_seconds
        #: seconds of one draft pass over n sequences; default: ``token_seconds`` whatever n
        self.time_model = time_model or StepTimeModel(token_seconds)
        self.vocab = list(vocab)
        self._rng = random.Random(seed)
        # Proposals are slices of a pre-drawn random stream: drawing per token would cost ~2.5 us per
        # sequence per call, which a draft step of d = 0 would charge to the scheduler.
        self._stream = [self._rng.choice(self.vocab) for _ in range(1 << 16)]
        self._cursor = 0
        self.busy_seconds = 0.0
        self.modelled_seconds = 0.0

    async def draft(self, batch: Sequence[DraftRequest]) -> list[Proposal]:
        started = time.perf_counter()
        stream, cursor, size = self._stream, self._cursor, len(self._stream)
        out = []
        for r in batch:
            n = r.num_tokens
            if cursor + n > size:
                cursor = self._rng.randrange(size - n)
            out.append(Proposal(stream[cursor : cursor + n]))
            cursor += n
        self._cursor = cursor
        duration = self.time_model.draft_seconds([r.num_tokens for r in batch])
        self.modelled_seconds += duration
        await wait_until(started + duration)
        self.busy_seconds += time.perf_counter() - started
        return out

    def release(self, request_id: str) -> None:
        return None


def standin_engine(
    verify_seconds: float,
    draft_token_seconds: float | None,
    alpha: float,
    settings: SchedulerSettings,
    seed: int = 0,
) -> tuple[Engine, StandInTarget]:
    """An Engine over stand-in executors (``draft_token_seconds=None``: no drafter)."""
    target = StandInTarget(verify_seconds, alpha, seed=seed)
    drafter: Drafter = (
        NoDrafter()
        if draft_token_seconds is None
        else DraftModelDrafter(StandInDraft(draft_token_seconds, seed + 1))
    )
    scheduler = SpeculativeScheduler(target, drafter, settings)
    return Engine(
        CharTokenizer(), scheduler, model_info("standin", settings.max_model_len, backend="standin")
    ), target


def preset_engine(
    preset: SpeculationPreset,
    settings: SchedulerSettings,
    *,
    speculate: bool = True,
    time_scale: float = 1.0,
    seed: int = 0,
) -> tuple[Engine, StandInTarget]:
    """An Engine over stand-ins with a preset's step times (multiplied by ``time_scale``) and acceptance;
    ``speculate=False``: the target alone (no drafter)."""
    scaled = preset.scaled(time_scale)
    target = StandInTarget(
        scaled.target.memory_bound_seconds,
        preset.acceptance.mean,
        seed=seed,
        max_draft_len=preset.max_draft_len,
        time_model=scaled.target,
        acceptance=preset.acceptance,
    )
    drafter: Drafter = (
        DraftModelDrafter(StandInDraft(scaled.draft.memory_bound_seconds, seed + 1, time_model=scaled.draft))
        if speculate
        else NoDrafter()
    )
    scheduler = SpeculativeScheduler(target, drafter, settings)
    info = model_info(preset.name, settings.max_model_len, backend="standin")
    return Engine(CharTokenizer(), scheduler, info), target


class InstantEngine:
    """An EngineClient that produces ``tokens_per_step`` tokens per step with no model and no scheduler:
    it isolates the cost of the HTTP layer."""

    def __init__(self, tokens_per_step: int = 1, name: str = "instant", max_model_len: int = 1 << 20) -> None:
        self.tokenizer: Tokenizer = CharTokenizer()
        self.info: ModelInfo = model_info(name, max_model_len, backend="standin")
        self.tokens_per_step = tokens_per_step
        self._stats = GlobalStats()
        self._running = False

    @property
    def ready(self) -> bool:
        return self._running

    @property
    def queue_depth(self) -> int:
        return 0

    @property
    def queue_seconds(self) -> float:
        return 0.0

    def queue_full(self) -> bool:
        return False  # no queue: every request runs at once

    @property
    def generation_rate(self) -> float:
        return 0.0

    @property
    def stats(self) -> GlobalStats:
        return self._stats

    def generate(
        self,
        prompt_ids: list[int],
        max_tokens: int,
        params: SamplingParams,
        constraint: TokenConstraint | None = None,
        speculation: RequestSpeculation = NO_REQUEST_SPECULATION,
    ) -> Generation:
        stats = SeqStats()
        return Generation(self._produce(max_tokens, stats), stats)

    async def _produce(self, max_tokens: int, stats: SeqStats) -> AsyncGenerator[StepOutput, None]:
        done = 0
        while done < max_tokens:
            n = min(self.tokens_per_step, max_tokens - done)
            done += n
            stats.steps += 1
            finish = FinishReason.LENGTH if done >= max_tokens else None
            yield StepOutput([97 + (done + i) % 26 for i in range(n)], finish, 0, 0)
            await asyncio.sleep(0)

    async def start(self) -> None:
        self._running = True

    async def stop(self, timeout: float) -> None:
        self._running = False
