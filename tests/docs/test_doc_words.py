"""The docs stay short enough to read: `make words` (hack/doc_words.py) counts README.md and docs/*.md (not
the generated docs/api.md) as `wc -w` does, and their total stays within its BUDGET."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from hack import doc_words

REPO = Path(__file__).resolve().parents[2]


def test_the_docs_stay_within_their_word_budget() -> None:
    per_file = doc_words.counts()
    total = sum(per_file.values())
    biggest = sorted(per_file.items(), key=lambda item: -item[1])[:3]
    assert total <= doc_words.BUDGET, (
        f"README.md and docs/ total {total} words, over the budget of {doc_words.BUDGET} "
        f"(hack/doc_words.py) by {total - doc_words.BUDGET}; the longest: {biggest}"
    )


def test_the_commands_counts_are_those_of_wc() -> None:
    """The command's output, per file and in total, against `wc -w` over the files listed here, not by it."""
    out = subprocess.run(
        [sys.executable, "hack/doc_words.py"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    reported = {m.group(2): int(m.group(1)) for m in re.finditer(r"^ *(\d+)  (\S+)", out, re.MULTILINE)}
    docs = sorted(name for name in os.listdir(REPO / "docs") if name.endswith(".md") and name != "api.md")
    files = ["README.md", *(f"docs/{name}" for name in docs)]
    wc = subprocess.run(
        ["wc", "-w", *files],
        cwd=REPO,
        env={**os.environ, "LC_ALL": "C.UTF-8"},  # a word may be made of UTF-8 characters only (`—`)
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    counted = {path: int(n) for n, path in (line.split() for line in wc.splitlines())}
    assert reported == counted, f"hack/doc_words.py:\n{out}\nwc -w:\n{wc}"
    assert "docs/api.md" not in reported


def test_the_report_says_by_how_much_the_total_is_over_budget() -> None:
    report = doc_words.report({"README.md": 30, "docs/server.md": 20}, budget=40)
    assert report.splitlines()[-2].split()[:2] == ["50", "total"]
    assert report.splitlines()[-1] == "over budget by 10 words"
    assert "over budget" not in doc_words.report({"README.md": 40}, budget=40)
