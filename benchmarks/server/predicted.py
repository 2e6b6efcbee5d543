"""Benchmark 8: Predicted Outputs, reference backend on CPU, the demo models.

The prediction is the target's own greedy output for the prompt, with 0 %, 2 %, 10 % or 50 % of its tokens
replaced by random ones (as text: decoded and tokenised again, as the server tokenises a request's
prediction), or an unrelated text (a recipe; the demo models read about Kubernetes). Each set of requests
runs with its predictions and without (the baseline: the same requests, no prediction), in two passes (the
second in reverse order) with the baseline before, between and after them, on the same engine, at
concurrency 1 (the requests one at a time) and 8 (eight at once), with the deployment's draft model on
(``draftTarget``, ``draftLen`` 4) and off (``none``). The figure is the ratio of tokens/s, measured in the
same run: the machine is shared, absolute rates drift. Greedy output with a prediction must be identical to
the baseline's.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.types import RequestSpeculation, SamplingParams
from specdeploy_server.demo_models import SAMPLE_PROMPTS, TrainSettings, build
from specdeploy_server.engine import EngineClient

EDITS = (0.0, 0.02, 0.10, 0.50)
UNRELATED = "unrelated"
DEPLOYMENTS = ("draftTarget", "none")
CONCURRENCY = (1, 8)
#: the targets this section is measured against: tokens/s with a prediction over without
TARGETS = {"0%": 3.0, "2%": 2.0, UNRELATED: 0.95}
GREEDY = SamplingParams(temperature=0.0)
#: the unrelated prediction: text about something the demo models never read
UNRELATED_TEXT = (
    "Preheat the oven to two hundred degrees. Whisk four eggs with a cup of sugar until pale, fold in the "
    "flour and a pinch of salt, pour the batter into a buttered tin and bake for forty minutes. Let the cake "
    "cool on a rack before you dust it with icing sugar and cut it into squares for the picnic basket."
)
#: the requests of a round: one at a time at concurrency 1, all at once at concurrency 8
PROMPTS = SAMPLE_PROMPTS


@dataclass(frozen=True)
class PredictedResult:
    deployment: str
    concurrency: int
    prediction: str  # "0%", "2%", "10%", "50%" of the tokens changed, or "unrelated"
    edit_fraction: float | None
    tok_s: float
    baseline_tok_s: float
    #: accepted prediction tokens over generated tokens
    accepted_share: float
    identical: bool
    tokens: int

    @property
    def speedup(self) -> float:
        return self.tok_s / self.baseline_tok_s if self.baseline_tok_s else 0.0


def label(fraction: float) -> str:
    return f"{round(fraction * 100)}%"


def _edited(tokens: list[int], fraction: float, rng: random.Random, vocab: range) -> list[int]:
    out = list(tokens)
    for i in rng.sample(range(len(out)), round(len(out) * fraction)):
        out[i] = rng.choice(vocab)
    return out


async def _batch(
    engine: EngineClient, prompts: list[list[int]], max_new: int, predictions: list[tuple[int, ...]] | None
) -> tuple[float, list[list[int]], int]:
    """The requests all at once: (seconds, outputs, accepted prediction tokens)."""

    async def one(i: int) -> tuple[list[int], int]:
        speculation = RequestSpeculation(predictions[i] if predictions is not None else ())
        gen = engine.generate(prompts[i], max_new, GREEDY, speculation=speculation)
        tokens = [t async for out in gen.outputs for t in out.token_ids]
        return tokens, gen.stats.prediction_accepted

    started = time.perf_counter()
    results = await asyncio.gather(*(one(i) for i in range(len(prompts))))
    return time.perf_counter() - started, [r[0] for r in results], sum(r[1] for r in results)


async def _timed(
    engine: EngineClient,
    prompts: list[list[int]],
    max_new: int,
    concurrency: int,
    predictions: list[tuple[int, ...]] | None,
) -> tuple[float, list[list[int]], int]:
    """The requests ``concurrency`` at a time: (seconds, outputs, accepted prediction tokens)."""
    seconds, outputs, accepted = 0.0, [], 0
    for start in range(0, len(prompts), concurrency):
        part = slice(start, start + concurrency)
        s, o, a = await _batch(engine, prompts[part], max_new, predictions[part] if predictions else None)
        seconds, accepted = seconds + s, accepted + a
        outputs += o
    return seconds, outputs, accepted


def _config(models: Path, deployment: str) -> dict[str, Any]:
    model: dict[str, Any] = {"target": str(models / "target")}
    speculative: dict[str, Any] = {"method": deployment}
    if deployment == "draftTarget":
        model["draft"] = str(models / "draft")
        speculative["draftLen"] = 4
    return {"model": model, "speculative": speculative, "placement": {"device": "cpu", "cpuThreads": 1}}


async def _deployment(models: Path, deployment: str, max_new: int, seed: int) -> list[PredictedResult]:
    engine = build_engine(ServerConfig.model_validate(_config(models, deployment)))
    await engine.start()
    tokenizer = engine.tokenizer
    prompts = [tokenizer.encode(p) for p in PROMPTS]
    vocab = range(3, engine.info.vocab_size or 256)
    results: list[PredictedResult] = []
    try:
        await _timed(engine, prompts[:2], 8, 1, None)  # warm-up
        for concurrency in CONCURRENCY:
            asked = prompts
            before, plain, _ = await _timed(engine, asked, max_new, concurrency, None)
            rng = random.Random(seed)
            conditions: list[tuple[str, float | None, list[tuple[int, ...]]]] = []
            for edit in EDITS:
                edited = [tokenizer.decode(_edited(out, edit, rng, vocab)) for out in plain]
                conditions.append((label(edit), edit, [tuple(tokenizer.encode(t, False)) for t in edited]))
            unrelated = tuple(tokenizer.encode(UNRELATED_TEXT, False))
            conditions.append((UNRELATED, None, [unrelated] * len(plain)))
            # two passes, the second in reverse order, with the baseline between and after them: a load that
            # drifts during the measurement weighs on every condition and the baseline alike
            timed = {name: (0.0, True, 0) for name, _, _ in conditions}
            middle = 0.0
            for order in (conditions, conditions[::-1]):
                for name, _, predictions in order:
                    seconds, outputs, accepted = await _timed(
                        engine, asked, max_new, concurrency, predictions
                    )
                    spent, same, _ = timed[name]
                    timed[name] = (spent + seconds, same and outputs == plain, accepted)
                if not middle:
                    middle, _, _ = await _timed(engine, asked, max_new, concurrency, None)
            after, _, _ = await _timed(engine, asked, max_new, concurrency, None)
            tokens = sum(len(o) for o in plain)
            baseline = tokens / ((before + 2 * middle + after) / 4)
            for name, fraction, _ in conditions:
                seconds, identical, accepted = timed[name]
                seconds /= 2
                results.append(
                    PredictedResult(
                        deployment=deployment,
                        concurrency=concurrency,
                        prediction=name,
                        edit_fraction=fraction,
                        tok_s=round(tokens / seconds, 1),
                        baseline_tok_s=round(baseline, 1),
                        accepted_share=round(accepted / tokens, 3) if tokens else 0.0,
                        identical=identical,
                        tokens=tokens,
                    )
                )
    finally:
        await engine.stop(5)
    return results


def run(max_new: int = 48, train_steps: int = 60, seed: int = 0) -> list[PredictedResult]:
    with tempfile.TemporaryDirectory() as tmp:
        models = Path(tmp) / "models"
        build(models, TrainSettings(steps=train_steps, seed=seed))
        results: list[PredictedResult] = []
        for deployment in DEPLOYMENTS:
            results += asyncio.run(_deployment(models, deployment, max_new, seed))
        return results


def table(rows: list[PredictedResult]) -> str:
    lines = [
        "| draft model | concurrency | prediction | tok/s | tok/s without | speedup | accepted share "
        "| identical |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {'on' if r.deployment == 'draftTarget' else 'off'} | {r.concurrency} | {r.prediction} "
            f"| {r.tok_s:.0f} | {r.baseline_tok_s:.0f} | {r.speedup:.2f}x | {r.accepted_share:.0%} "
            f"| {'yes' if r.identical else 'NO'} |"
        )
    return "\n".join(lines)


def verdicts(rows: list[PredictedResult]) -> str:
    """Each target: met in every deployment and concurrency, or where not."""
    parts = []
    for name, bound in TARGETS.items():
        mine = [r for r in rows if r.prediction == name]
        worst = min(mine, key=lambda r: r.speedup) if mine else None
        if worst is None:
            continue
        met = worst.speedup >= bound
        parts.append(
            f"{name}: at least {bound:g}x {'met' if met else 'NOT met'} (lowest {worst.speedup:.3f}x, "
            f"draft model {'on' if worst.deployment == 'draftTarget' else 'off'}, concurrency "
            f"{worst.concurrency})"
        )
    return "; ".join(parts)


PLOT = "docs/images/predicted-outputs.png"


def plot(rows: list[PredictedResult], path: Path) -> None:
    """Speedup against the fraction of the prediction's tokens changed, one line per deployment and
    concurrency, the unrelated prediction as a marker at the right (PNG)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for deployment in DEPLOYMENTS:
        for concurrency in CONCURRENCY:
            mine = [r for r in rows if r.deployment == deployment and r.concurrency == concurrency]
            series = sorted((r.edit_fraction, r.speedup) for r in mine if r.edit_fraction is not None)
            name = f"draft model {'on' if deployment == 'draftTarget' else 'off'}, concurrency {concurrency}"
            (line,) = ax.plot([f * 100 for f, _ in series], [s for _, s in series], marker="o", label=name)
            unrelated = [r.speedup for r in mine if r.prediction == UNRELATED]
            if unrelated:
                ax.plot([100], unrelated, marker="x", markersize=9, color=line.get_color(), linestyle="none")
    ax.axhline(1.0, color="grey", linewidth=1)
    ax.set_xlabel("tokens of the prediction changed (%); x at 100: an unrelated prediction")
    ax.set_ylabel("tokens/s with the prediction / without")
    ax.set_title("Predicted outputs, reference backend, demo models (CPU)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
