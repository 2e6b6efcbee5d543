"""The self-distillation block of docs/benchmarks.md, rendered from the record `python -m benchmarks.distill`
writes (benchmarks/results/distill.json; see benchmarks/records.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from benchmarks.records import Record, provenance

LABELS = {
    "reference": "the stale draft (before)",
    "draftModel": "distilled on greedy answers",
    "draftModel-sampled": "distilled on sampled answers",
    "eagle3": "an EAGLE-3 head, greedy answers",
}


def render(records: Sequence[Record]) -> str:
    record = records[0]
    figures: dict[str, Any] = record["figures"]
    rows = [
        "| Draft | Temperature | Acceptance | Tokens per target step | Drafted tokens |",
        "|---|---:|---:|---:|---:|",
    ]
    for m in figures["measurements"]:
        rows.append(
            f"| {LABELS.get(m['draft'], m['draft'])} | {m['temperature']:g} | {m['acceptance']:.3f} "
            f"| {m['tokens_per_step']:.2f} | {m['drafted']} |"
        )
    trainings = figures["trainings"]
    lines = []
    for label, t in trainings.items():
        gen, trained = t["generated"], t["trained"]
        lines.append(
            f"- `{label}`: {gen['samples']} samples ({gen['completionTokens']} tokens), {trained['steps']} "
            f"steps, loss {trained['loss']:.3f}, {t['wall_seconds']:.0f} s to `Succeeded`."
        )
    steps = record["parameters"]
    return (
        f"{provenance(record)}\n\n"
        f"A target trained {steps['demo_training_steps']} steps, its draft {steps['stale_draft_steps']} (a "
        "target that moved on). "
        f"{figures['held_out']} held-out prompts (of {figures['prompts']}), "
        f"{record['parameters']['max_tokens']} tokens each (three answers at temperature 1), real CPU pods, "
        "the servers' own counters.\n\n" + "\n".join(rows) + "\n\n" + "\n".join(lines) + "\n"
    )
