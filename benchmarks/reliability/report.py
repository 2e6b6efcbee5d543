"""The table of docs/reliability.md: one row per scenario (what was injected, what was checked, the result,
the figures), rendered from a campaign record. Every part of the campaign (the server's now; the operator's
can follow) writes its own record with the same row shape and gets its own block of the doc."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.records import Record, provenance


@dataclass
class ScenarioResult:
    scenario: str
    injected: str
    checked: str
    passed: bool
    figures: dict[str, Any]
    summary: str  # the figures a reader needs, in one line
    problems: list[str] = field(default_factory=list)

    def as_row(self) -> dict[str, Any]:
        return asdict(self)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(recs: Sequence[Record]) -> str:
    record = recs[0]
    rows = record["figures"]["scenarios"]
    passed = sum(bool(row["passed"]) for row in rows)
    lines = [
        provenance(record),
        "",
        f"**{passed} of {len(rows)} scenarios passed.**",
        "",
        "| scenario | injected | checked | result | figures |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        result = "pass" if row["passed"] else "**FAIL**: " + "; ".join(row["problems"][:3])
        cells = (row["scenario"], row["injected"], row["checked"], result, row["summary"])
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    notes = record["figures"].get("notes", [])
    if notes:
        lines += ["", *[f"- {note}" for note in notes]]
    return "\n".join(lines) + "\n"
