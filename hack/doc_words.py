"""Count the words a reader of the docs faces: README.md and docs/*.md, docs/api.md left out (it is generated
from the models, a reference looked up, not read through).

python3 hack/doc_words.py      # words per file, then the total and the budget
make words                     # the same

A word is what `wc -w` counts: a run of characters between whitespace. BUDGET is the most the docs may
total; tests/docs/test_doc_words.py fails above it. Only the standard library is used.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

#: The most words README.md and docs/*.md (docs/api.md excluded) may total.
BUDGET = 39_000

#: Generated reference pages, not counted.
GENERATED = frozenset({"docs/api.md"})


def doc_files(root: Path = REPO) -> list[Path]:
    """README.md, then every docs/*.md but the generated ones, sorted."""
    docs = sorted(p for p in (root / "docs").glob("*.md") if p.relative_to(root).as_posix() not in GENERATED)
    return [root / "README.md", *docs]


def words(text: str) -> int:
    return len(text.split())


def counts(root: Path = REPO) -> dict[str, int]:
    """Path relative to `root` -> its words, for every counted file."""
    return {p.relative_to(root).as_posix(): words(p.read_text(encoding="utf-8")) for p in doc_files(root)}


def report(per_file: dict[str, int], budget: int = BUDGET) -> str:
    total = sum(per_file.values())
    width = max(map(len, per_file))
    lines = [f"{count:>7}  {path}" for path, count in per_file.items()]
    lines.append(f"{total:>7}  {'total':<{width}}  (budget {budget}, docs/api.md not counted)")
    if total > budget:
        lines.append(f"over budget by {total - budget} words")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hack/doc_words.py", description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    print(report(counts()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
