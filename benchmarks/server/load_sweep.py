"""Benchmark 7: speculation under load — fixed draft lengths against ``draftLen: auto``, concurrency 1 to 256.

Closed loop: ``concurrency`` clients each keep one request in flight (resubmitting as soon as one ends); each
window is a steady state after a warm-up (the controller's first exploratory steps fall in the warm-up), on a
fresh engine (on the reference backend: one engine per policy, kept for all of a concurrency's windows);
each point is the median of ``REPEATS`` windows (``REFERENCE_ROUNDS`` on the reference backend), the
policies of a concurrency taking turns.
Policies: fixed k in {0, 2, 4, 8} (k = 0: no drafter at all, plain decoding) and auto.

* **Stand-ins with the presets** (``backends.step_costs.PRESETS``, estimates derived from seed 003): each call
  sleeps for the preset's roofline time — memory-bound below a knee, compute-bound above — multiplied by
  ``time_scale`` so the sweep finishes in minutes. Throughput and inter-token latency are reported in the
  preset's own time (measured figures divided by the scale). Concurrency 1-256.
* **The reference backend** on CPU with the tiny models of benchmark 2 (``assisted.build_models``),
  concurrency 1-8: real forwards, costs as the backend has them.

Inter-token latency is a sequence's mean gap between tokens in the window: window seconds x concurrency /
tokens (every client is busy all through it). The prediction at concurrency 1 is the preset's: tokens per
step from the acceptance (per-prompt alphas averaged as a closed loop weighs them: the harmonic mean of tokens
per step) over the modelled step time.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdeploy_server.backends.standin import StandInDraft, preset_engine
from specdeploy_server.backends.step_costs import PRESETS, SpeculationPreset, expected_tokens_per_step
from specdeploy_server.core.drafters import DraftModelDrafter
from specdeploy_server.core.scheduler import SchedulerSettings
from specdeploy_server.core.types import SamplingParams

FIXED = (0, 2, 4, 8)
STANDIN_LEVELS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
REFERENCE_LEVELS = (1, 2, 4, 8)
TIME_SCALE = 0.25
REQUEST_TOKENS = 256
#: windows per point, the policies of a concurrency taking turns (k=0, k=2, ..., auto, k=0, ...); the point is
#: the window with the median tokens/s, so that a burst of load on the shared machine hits one window of one
#: policy, not the whole of it
REPEATS = 3
#: the reference backend's windows. Its real forwards on this shared CPU drift by 10-30 % over seconds (other
#: people's load), more than policies at concurrency 1-2 differ, so a window of each policy in turn on a fresh
#: engine compared the machine's moments more than the policies. Its five engines (one per policy) are
#: built and warmed up once per concurrency and then take turns, ``REFERENCE_ROUNDS`` windows of
#: ``REFERENCE_WINDOW_SECONDS`` each: every policy samples the machine's drift alike, and auto's controller
#: keeps what it measured from one window to the next, as in a server that runs for hours.
REFERENCE_ROUNDS = 9
REFERENCE_WINDOW_SECONDS = 1.0
REFERENCE_WARMUP_SECONDS = 1.0  # an engine's first window opens after this (its first exploratory steps)
REFERENCE_RAMP_SECONDS = 0.1  # the later ones once the clients are back in flight
WINDOW_MIN_STEPS = 2  # a window closes after its seconds, but not before this many engine steps
WINDOW_STRETCH = 20  # ... nor later than this many times its seconds
#: stand-in windows at up to this concurrency are aligned on requests (see _standin_point)
ALIGNED_LEVELS = 16
#: the stand-ins' prompts, one per request in turn (n-th request: prompt n): a prompt fixes its alpha and the
#: acceptance at each position (``StandInTarget``), so every policy of a concurrency meets the same prompts
STANDIN_PROMPTS = [[97, 98, 99, *(48 + int(d) for d in str(n))] for n in range(4096)]


@dataclass(frozen=True)
class SweepPoint:
    backend: str  # "standin" or "reference"
    model: str  # the preset's name, or "tiny-cpu"
    concurrency: int
    policy: str  # "k=0", "k=2", ..., "auto"
    tokens: int
    seconds: float  # wall-clock length of the window (stand-ins: in preset time, measured / time scale)
    sequence_steps: int
    drafted: int
    speculating_steps: int
    #: stand-ins: the seconds the time model charged for the window's calls (the simulated GPU's busy time,
    #: no host overhead, no machine load in it); reference backend: equal to ``seconds``
    gpu_seconds: float
    #: stand-ins at concurrency 1: [alpha, tokens] for the prompts the window served (the tokens they emitted
    #: in it), from which the window's prediction is computed; empty elsewhere
    served_alphas: list[list[float]] = field(default_factory=list)

    @property
    def tok_s(self) -> float:
        """Tokens per second of simulated GPU time (reference backend: of wall-clock time)."""
        return self.tokens / self.gpu_seconds

    @property
    def wall_tok_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def itl_ms(self) -> float:
        return 1000 * self.gpu_seconds * self.concurrency / self.tokens

    @property
    def mean_draft_len(self) -> float:
        return self.drafted / self.sequence_steps if self.sequence_steps else 0.0


def _policy(k: int | None) -> str:
    return "auto" if k is None else f"k={k}"


async def _closed_loop(
    engine: Any,
    prompts: Sequence[list[int]],
    concurrency: int,
    max_tokens: int,
    *,
    warmup_steps: int,
    min_seconds: float,
    min_tokens: int,
    min_steps: int,
    max_seconds: float,
    busy: Callable[[], float] = time.perf_counter,
    served: Callable[[], Counter[float]] = Counter,
    warmup_requests: int = 0,
    warmup_seconds: float = 0.3,
    keep_running: bool = False,
) -> tuple[int, float, int, int, int, float, Counter[float]]:
    """(tokens, seconds, sequence steps, drafted, speculating sequence steps, busy seconds, served) of a
    steady-state window; ``busy`` is the clock of the busy time (default: the wall clock), ``served`` counts
    the tokens emitted so far by the alpha of their prompt (default: nothing). The window opens once
    ``warmup_steps`` steps, ``warmup_seconds`` and ``warmup_requests`` finished requests are past.
    ``keep_running``: the engine is not stopped; the clients finish the requests they have in flight, so
    the engine (and its controller's measurements) serve the next window as they are."""
    stats = engine.stats
    stop = False
    params = SamplingParams(temperature=0.0)

    async def client(i: int) -> None:
        n = i
        while not stop:
            gen = engine.generate(list(prompts[n % len(prompts)]), max_tokens, params)
            async for _ in gen.outputs:
                pass
            n += concurrency

    speculating = [0]
    observer = engine.scheduler.observer
    on_speculation = observer.on_speculation

    def count(step: Any) -> None:
        speculating[0] += sum(step.accepted_counts)
        on_speculation(step)

    observer.on_speculation = count
    clients = [asyncio.ensure_future(client(i)) for i in range(concurrency)]
    started = time.perf_counter()
    while (
        stats.steps < warmup_steps
        or time.perf_counter() - started < warmup_seconds
        or stats.requests_finished < warmup_requests
    ):
        await asyncio.sleep(0.01)
    t0, e0, s0, d0, p0 = (
        time.perf_counter(),
        stats.emitted,
        stats.sequence_steps,
        stats.drafted,
        speculating[0],
    )
    b0, steps0, served0 = busy(), stats.steps, Counter(served())
    while True:
        await asyncio.sleep(0.02)
        elapsed = time.perf_counter() - t0
        enough = stats.emitted - e0 >= min_tokens and stats.steps - steps0 >= min_steps
        if elapsed >= max_seconds or (enough and elapsed >= min_seconds):
            break
    t1, e1, s1, d1, p1 = (
        time.perf_counter(),
        stats.emitted,
        stats.sequence_steps,
        stats.drafted,
        speculating[0],
    )
    b1, served1 = busy(), Counter(served())
    stop = True
    if not keep_running:
        await engine.stop(0)
    await asyncio.gather(*clients, return_exceptions=True)
    observer.on_speculation = on_speculation
    return e1 - e0, t1 - t0, s1 - s0, d1 - d0, p1 - p0, b1 - b0, served1 - served0


def _standin_point(preset: SpeculationPreset, concurrency: int, k: int | None, quick: bool) -> SweepPoint:
    settings = SchedulerSettings(
        max_batch_size=concurrency,
        max_queue_size=None,
        draft_len=k,
        max_draft_len=preset.max_draft_len,
        max_model_len=REQUEST_TOKENS + 16,
    )

    # Up to ALIGNED_LEVELS every policy's window starts after each client's first request and lasts a number
    # of tokens: the windows of the five policies then serve (nearly) the same prompts, whose alphas differ
    # (the 405B preset's spread), instead of whichever prompts a faster policy had reached. At concurrency 1
    # a speculating window holds three times the tokens: its tokens per step are compared with a prediction.
    aligned = concurrency <= ALIGNED_LEVELS

    async def main() -> SweepPoint:
        engine, target = preset_engine(
            preset, settings, speculate=k != 0, time_scale=TIME_SCALE, seed=concurrency
        )
        drafter = engine.scheduler.drafter
        draft = drafter.executor if isinstance(drafter, DraftModelDrafter) else None

        def modelled() -> float:
            extra = draft.modelled_seconds if isinstance(draft, StandInDraft) else 0.0
            return target.modelled_seconds + extra

        await engine.start()
        tokens, seconds, steps, drafted, speculating, gpu, served = await _closed_loop(
            engine,
            STANDIN_PROMPTS,
            concurrency,
            REQUEST_TOKENS,
            warmup_steps=12,
            warmup_requests=concurrency if aligned else 0,
            min_seconds=0.0 if aligned else 0.4,
            min_tokens=(600 if quick else 1000) * (3 if concurrency == 1 and k != 0 else 1),
            min_steps=10,
            max_seconds=(1.0 if quick else 2.0) * (5 if aligned else 1),
            busy=modelled,
            served=lambda: target.emitted_by_alpha,
        )
        return SweepPoint(
            "standin", preset.name, concurrency, _policy(k), tokens, seconds / TIME_SCALE, steps, drafted,
            speculating, gpu / TIME_SCALE,
            sorted([round(a, 6), float(n)] for a, n in served.items()) if concurrency == 1 else [],
        )  # fmt: skip

    return asyncio.run(main())


async def take_turns(
    engines: dict[int | None, Any],
    prompts: Sequence[list[int]],
    concurrency: int,
    max_tokens: int,
    *,
    rounds: int,
    window_seconds: float,
    warmup_seconds: float,
    started_by_caller: bool = False,
) -> dict[int | None, list[tuple[int, float, int, int, int]]]:
    """Windows of engines (one per policy, by draft length; None: auto) taking turns on one machine: each is
    started, then every round each serves one closed-loop window, the first after ``warmup_seconds`` (and 10
    steps), the later ones once its clients are back in flight; the engines stay warm between their windows
    and are stopped at the end. ``started_by_caller``: the engines are running already and are left running
    (the caller measures them again). Per policy, each window's (tokens, seconds, sequence steps, drafted,
    speculating sequence steps). A window lasts ``window_seconds`` and holds at least ``WINDOW_MIN_STEPS``
    engine steps (up to ``WINDOW_STRETCH`` times as long): on a busy machine a short window could otherwise
    close before a step ends and read zero tokens."""
    if not started_by_caller:
        for engine in engines.values():
            await engine.start()
    windows: dict[int | None, list[tuple[int, float, int, int, int]]] = {k: [] for k in engines}
    for round_ in range(rounds):
        for k, engine in engines.items():
            first = round_ == 0
            tokens, seconds, steps, drafted, speculating, _, _ = await _closed_loop(
                engine,
                prompts,
                concurrency,
                max_tokens,
                warmup_steps=10 if first else 0,
                warmup_seconds=warmup_seconds if first else REFERENCE_RAMP_SECONDS,
                min_seconds=window_seconds,
                min_tokens=0,
                min_steps=WINDOW_MIN_STEPS,
                max_seconds=window_seconds * WINDOW_STRETCH,
                keep_running=True,
            )
            windows[k].append((tokens, seconds, steps, drafted, speculating))
    if not started_by_caller:
        for engine in engines.values():
            await engine.stop(0)
    return windows


def _reference_points(quick: bool) -> list[SweepPoint]:
    import torch  # noqa: PLC0415
    from specdeploy_server.backends.factory import build_engine  # noqa: PLC0415
    from specdeploy_server.config import ServerConfig  # noqa: PLC0415
    from specdeploy_testkit import sample_text  # noqa: PLC0415

    from benchmarks.server import assisted  # noqa: PLC0415

    torch.set_num_threads(1)
    texts = sample_text.prompts(16, seed=11)
    out: list[SweepPoint] = []
    with tempfile.TemporaryDirectory() as tmp:
        target, draft = assisted.build_models(Path(tmp))

        def config(k: int | None) -> dict[str, Any]:
            speculative: dict[str, Any] = {"method": "none"} if k == 0 else {"method": "draftTarget"}
            if k != 0:
                speculative["draftLen"] = "auto" if k is None else k
            speculative["maxDraftLen"] = 8
            return {
                "model": {"target": str(target), "draft": str(draft)},
                "speculative": speculative,
                "placement": {"device": "cpu"},
                "runtime": {"maxBatchSize": 8},
            }

        async def level_points(level: int) -> list[SweepPoint]:
            engines = {k: build_engine(ServerConfig.model_validate(config(k))) for k in (*FIXED, None)}
            prompts = [engines[0].tokenizer.encode(t) for t in texts]
            windows = await take_turns(
                engines,
                prompts,
                level,
                48,
                rounds=1 if quick else REFERENCE_ROUNDS,
                window_seconds=REFERENCE_WINDOW_SECONDS,
                warmup_seconds=REFERENCE_WARMUP_SECONDS,
            )
            return [
                median_window(
                    [SweepPoint("reference", "tiny-cpu", level, _policy(k), *w, w[1]) for w in taken]
                )
                for k, taken in windows.items()
            ]

        for level in REFERENCE_LEVELS:
            out.extend(asyncio.run(level_points(level)))
    return out


def median_window(windows: Sequence[SweepPoint]) -> SweepPoint:
    """The window with the median tokens/s (the upper median of an even number)."""
    return sorted(windows, key=lambda p: p.tok_s)[len(windows) // 2]


def run(quick: bool = False, reference: bool = True) -> list[SweepPoint]:
    points: list[SweepPoint] = []
    for preset in PRESETS.values():
        for concurrency in STANDIN_LEVELS:
            windows: dict[int | None, list[SweepPoint]] = {k: [] for k in (*FIXED, None)}
            for _ in range(1 if quick else REPEATS):
                for k, taken in windows.items():
                    taken.append(_standin_point(preset, concurrency, k, quick))
            points.extend(median_window(w) for w in windows.values())
    if reference:
        points.extend(_reference_points(quick))
    return points


# ------------------------------------------------------------------------------------------ analysis
def predicted_speedup(
    preset: SpeculationPreset,
    k: int | None,
    served: Sequence[Sequence[float]] = (),
    draws: int = 20000,
) -> float:
    """Tokens/s at concurrency 1 over plain decoding's, as the preset predicts (auto: each prompt's best k).

    One client: each prompt's tokens cost step / E(alpha, k) seconds each, so the rate is 1 / mean(step / E)
    over the tokens. ``served``: the [alpha, tokens] a window served (the prediction for that window: its
    prompts, weighted by the tokens each emitted in it); empty: the preset's population of prompts."""
    if served:
        alphas, weights = [a for a, _ in served], [n for _, n in served]
    else:
        rng = random.Random(0)
        alphas = [preset.acceptance.draw(rng) for _ in range(draws if preset.acceptance.concentration else 1)]
        weights = [1.0] * len(alphas)

    def seconds_per_token(alpha: float, draft_len: int) -> float:
        return preset.step_seconds(1, draft_len) / expected_tokens_per_step(alpha, draft_len)

    if k is None:
        per_token = [min(seconds_per_token(a, j) for j in range(preset.max_draft_len + 1)) for a in alphas]
    else:
        per_token = [seconds_per_token(a, k) for a in alphas]
    mean = sum(w * t for w, t in zip(weights, per_token, strict=True)) / sum(weights)
    return preset.step_seconds(1, 0) / mean


@dataclass(frozen=True)
class Comparison:
    backend: str
    model: str
    concurrency: int
    best_fixed: str
    auto_vs_best: float
    auto_vs_plain: float
    #: the same two ratios from wall-clock tokens/s (stand-ins: with the host's overhead and load in them)
    wall_auto_vs_best: float
    wall_auto_vs_plain: float


def compare(points: Sequence[SweepPoint]) -> list[Comparison]:
    """Per (model, concurrency): auto over the best fixed k, and over k = 0."""
    by_key: dict[tuple[str, str, int], dict[str, SweepPoint]] = {}
    for p in points:
        by_key.setdefault((p.backend, p.model, p.concurrency), {})[p.policy] = p
    out = []
    for (backend, model, concurrency), policies in by_key.items():
        fixed = {name: p for name, p in policies.items() if name != "auto"}
        best = max(fixed.values(), key=lambda p: p.tok_s)
        wall_best = max(p.wall_tok_s for p in fixed.values())
        auto, plain = policies["auto"], policies["k=0"]
        out.append(
            Comparison(
                backend,
                model,
                concurrency,
                best.policy,
                auto.tok_s / best.tok_s,
                auto.tok_s / plain.tok_s,
                auto.wall_tok_s / wall_best,
                auto.wall_tok_s / plain.wall_tok_s,
            )
        )
    return out
