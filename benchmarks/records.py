"""Measured figures come from the command that measures them: each measuring command writes a record,
benchmarks/results/<name>.json (the command line, when and on what machine it ran, its figures), and rewrites
the delimited blocks of the docs that are rendered from that record.

Two kinds of block, each between a pair of HTML comments:

- MEASURED <name>: the rendering of its records (`BLOCKS[name].render`); `python -m benchmarks.records`
  re-renders every one from the records (after a change to a renderer), `--check` fails when one differs
  (tests/unit/test_measured_docs.py runs that check); `--stale` lists the records that may no longer describe
  the code (record_checks.py: a structural mismatch, which the tests fail on, or measured code changed since);
- PENDING <name>: figures typed by hand before the command wrote records. Its text says which command will
  replace it; the command replaces a PENDING block by its MEASURED block (and drops the rows of a pending
  table that name it, see `drop_pending_rows`).

What a record holds and how a command writes one is recording.py's; this module re-exports those names
(`records.new_record`, `records.save` ...) for the measuring commands.
"""

from __future__ import annotations

import argparse
import importlib
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from benchmarks import timings
from benchmarks.measured_paths import GPU_SECTIONS, SERVER_SECTIONS
from benchmarks.recording import (
    REPO,
    RESULTS,
    Record,
    command_line,
    finish,
    git_facts,
    load,
    machine_facts,
    new_record,
    now,
    provenance,
    save,
    tree_hash,
)

__all__ = [
    "BLOCK_RE",
    "CLUSTER_DOC",
    "DEVELOPMENT_DOC",
    "DOCS",
    "GPU_SECTIONS",
    "MEASURED_REGIONS",
    "OPERATOR_DOC",
    "RELIABILITY_DOC",
    "REPO",
    "RESULTS",
    "SERVER_DOC",
    "SERVER_SECTIONS",
    "Block",
    "Record",
    "begin_measured",
    "begin_pending",
    "blocks",
    "command_line",
    "drop_pending_rows",
    "end_measured",
    "end_pending",
    "find_blocks",
    "finish",
    "git_facts",
    "load",
    "machine_facts",
    "main",
    "new_record",
    "now",
    "pending_note",
    "provenance",
    "render",
    "replace_block",
    "save",
    "stale_blocks",
    "tree_hash",
    "update_docs",
]

DOCS = REPO / "docs"
Renderer = Callable[[Sequence[Record]], str]


# ------------------------------------------------------------------------------------------- the blocks


@dataclass(frozen=True)
class Block:
    """A delimited block of `doc`, rendered by `render` ("module:function") from the records `records`.

    `partial`: the block renders whichever of its records exist (one row each) and is always MEASURED;
    otherwise it needs its one record, and until that exists the doc holds a PENDING block of that name."""

    name: str
    doc: Path
    records: tuple[str, ...]
    render: str
    command: str
    partial: bool = False

    def renderer(self) -> Renderer:
        module, function = self.render.split(":")
        rendered: Renderer = getattr(importlib.import_module(module), function)
        return rendered


SERVER_DOC, OPERATOR_DOC, CLUSTER_DOC, RELIABILITY_DOC, DEVELOPMENT_DOC = (
    DOCS / "benchmarks-server.md",
    DOCS / "benchmarks.md",
    DOCS / "local-cluster.md",
    DOCS / "reliability.md",
    DOCS / "development.md",
)


def _server_block(number: int, section: str) -> Block:
    return Block(
        f"server-{section}",
        SERVER_DOC,
        (f"server-{section}",),
        f"benchmarks.server.render:{section.replace('-', '_')}",
        f"python -m benchmarks.server --only {number}",
    )


def blocks() -> list[Block]:
    """Every block of the docs rendered from records, in the order of the docs."""
    return [
        *(_server_block(i + 1, s) for i, s in enumerate(SERVER_SECTIONS)),
        Block(
            "server-gpu",
            SERVER_DOC,
            tuple(f"server-gpu-{section}" for section in GPU_SECTIONS),
            "benchmarks.server.render:gpu",
            "python -m benchmarks.server.gpu_day",  # what bash benchmarks/gpu_day.sh runs
            partial=True,
        ),
        Block(
            "autoscaling",
            OPERATOR_DOC,
            ("autoscaling",),
            "benchmarks.autoscaling_report:render",
            "python -m benchmarks.autoscaling",
        ),
        Block(
            "distill",
            OPERATOR_DOC,
            ("distill",),
            "benchmarks.distill_report:render",
            "python -m benchmarks.distill",
        ),
        Block(
            "operator",
            OPERATOR_DOC,
            ("operator",),
            "benchmarks.operator.report:render",
            "python -m benchmarks.operator",
        ),
        Block(
            "operator-1000",
            OPERATOR_DOC,
            ("operator-1000",),
            "benchmarks.operator.report:render",
            "python -m benchmarks.operator --count 1000",
        ),
        Block(
            "operator-multinode",
            OPERATOR_DOC,
            ("operator-multinode",),
            "benchmarks.operator.report:render",
            "python -m benchmarks.operator --multinode",
        ),
        Block(
            "memory",
            CLUSTER_DOC,
            ("memory",),
            "benchmarks.memory:render",
            "python -m benchmarks.memory",
        ),
        Block(
            "reliability-server",
            RELIABILITY_DOC,
            ("reliability-server",),
            "benchmarks.reliability.report:render",
            "python -m benchmarks.reliability",
        ),
        Block(
            "reliability-operator",
            RELIABILITY_DOC,
            ("reliability-operator",),
            "benchmarks.operator_faults.report:render",
            "python -m benchmarks.operator_faults",
        ),
        Block(
            "local-cluster-times",
            DEVELOPMENT_DOC,
            tuple(timings.record_name(m.name) for m in timings.MEASUREMENTS),
            "benchmarks.timings:render",
            "make measure NAME=<measurement>",
            partial=True,
        ),
        Block(
            "first-run",
            REPO / "README.md",
            (timings.record_name("demo-cold"),),
            "benchmarks.timings:render_first_run",
            "make measure NAME=demo-cold",
        ),
        Block(
            "test-durations",
            DEVELOPMENT_DOC,
            (timings.record_name("test-warm"),),
            "benchmarks.durations:render",
            "make measure NAME=test-warm",
        ),
    ]


# Docs whose tables are all measured figures (None), or whose tables under the given heading are.
MEASURED_REGIONS: dict[Path, str | None] = {
    SERVER_DOC: None,
    OPERATOR_DOC: None,
    CLUSTER_DOC: "## Memory",
    DEVELOPMENT_DOC: "## Measured times",
    RELIABILITY_DOC: "## Server",  # the findings table further down is not measured figures
}


# ------------------------------------------------------------------------------------------ markers


def begin_measured(name: str) -> str:
    return (
        f"<!-- BEGIN MEASURED {name}: written from benchmarks/results/ by the command it names "
        "(`python -m benchmarks.records` re-renders it); do not edit -->"
    )


def end_measured(name: str) -> str:
    return f"<!-- END MEASURED {name} -->"


def begin_pending(name: str) -> str:
    return f"<!-- BEGIN PENDING {name}: typed by hand; the command named below replaces it -->"


def end_pending(name: str) -> str:
    return f"<!-- END PENDING {name} -->"


BLOCK_RE = re.compile(r"<!-- BEGIN (MEASURED|PENDING) ([\w.-]+): .*? -->\n(.*?)<!-- END \1 \2 -->", re.DOTALL)


def find_blocks(text: str) -> list[tuple[str, str, str]]:
    """(kind, name, body) of every block of `text`, in order."""
    return [(m.group(1), m.group(2), m.group(3)) for m in BLOCK_RE.finditer(text)]


def _span(text: str, begin: str, end: str) -> tuple[int, int] | None:
    if text.count(begin) > 1 or text.count(end) > 1:
        raise ValueError(f"more than one {begin!r}")
    if begin not in text:
        return None
    start = text.index(begin)
    stop = text.index(end, start) + len(end)
    return start, stop


def replace_block(text: str, name: str, body: str) -> str:
    """`text` with the MEASURED block `name` holding `body`; a PENDING block of that name (when there is no
    MEASURED one) is replaced by it."""
    block = f"{begin_measured(name)}\n{body.rstrip()}\n{end_measured(name)}"
    for begin, end in ((begin_measured(name), end_measured(name)), (begin_pending(name), end_pending(name))):
        span = _span(text, begin, end)
        if span is not None:
            return text[: span[0]] + block + text[span[1] :]
    raise ValueError(f"no MEASURED or PENDING block {name!r}")


def pending_note(command: str) -> str:
    return f"**Not yet regenerated by `{command}`**"


def drop_pending_rows(text: str, name: str, token: str) -> str:
    """`text` with the lines of the PENDING block `name` that contain `token` removed (a pending table's rows
    that a record now replaces); the whole block once no row of its table is left."""
    span = _span(text, begin_pending(name), end_pending(name))
    if span is None:
        return text
    inner = text[span[0] : span[1]].split("\n")
    kept = [line for line in inner if token not in line]
    if sum(line.startswith("|") for line in kept) <= 2:  # only the table's header is left: the block goes
        return text[: span[0]] + text[span[1] :].removeprefix("\n\n")
    return text[: span[0]] + "\n".join(kept) + text[span[1] :]


# --------------------------------------------------------------------------------------- rendering


def render(block: Block, results: Path = RESULTS) -> str | None:
    """The body of `block` from its records; None when it needs a record that does not exist."""
    records = [r for r in (load(name, results) for name in block.records) if r is not None]
    if not records and not block.partial:
        return None
    return block.renderer()(records)


def update_docs(record_names: Iterable[str], results: Path = RESULTS) -> list[Path]:
    """Re-render in their docs the MEASURED blocks that depend on `record_names`; returns the docs written."""
    wanted = set(record_names)
    written: list[Path] = []
    for block in blocks():
        if not wanted & set(block.records):
            continue
        body = render(block, results)
        if body is None:
            continue
        text = block.doc.read_text()
        updated = replace_block(text, block.name, body)
        if updated != text:
            block.doc.write_text(updated)
            written.append(block.doc)
    return written


def stale_blocks(results: Path = RESULTS) -> list[str]:
    """Names of the blocks whose text in their doc is not the rendering of their records."""
    stale = []
    for block in blocks():
        body = render(block, results)
        if body is None:
            continue
        text = block.doc.read_text()
        if replace_block(text, block.name, body) != text:
            stale.append(block.name)
    return stale


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.records", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--check", action="store_true", help="fail when a block is stale")
    parser.add_argument(
        "--stale",
        action="store_true",
        help="list the records whose structure no longer matches the code (exit 1) or whose measured code "
        "changed since they were taken (a report: exit 0)",
    )
    args = parser.parse_args(argv)
    if args.stale:
        from benchmarks.record_checks import stale_report  # noqa: PLC0415 (it imports this module's names)

        lines = stale_report()
        print("\n".join(lines) or "every record measured the code as it is now")
        return 1 if any(": structure: " in line for line in lines) else 0
    if args.check:
        stale = stale_blocks()
        for name in stale:
            print(f"stale: {name} (run `python -m benchmarks.records`)", file=sys.stderr)
        return 1 if stale else 0
    names = [b for block in blocks() for b in block.records]
    for path in sorted(set(update_docs(names))):
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
