"""Measured figures come from the command that measures them: each measuring command writes a record,
benchmarks/results/<name>.json (the command line, when and on what machine it ran, its figures), and rewrites
the delimited blocks of the docs that are rendered from that record.

Two kinds of block, each between a pair of HTML comments:

- MEASURED <name>: the rendering of its records (`BLOCKS[name].render`); `python -m benchmarks.records`
  re-renders every one from the records (after a change to a renderer), `--check` fails when one differs
  (tests/unit/test_measured_docs.py runs that check);
- PENDING <name>: figures typed by hand before the command wrote records. Its text says which command will
  replace it; the command replaces a PENDING block by its MEASURED block (and drops the rows of a pending
  table that name it, see `drop_pending_rows`).

Record layout: {"name", "command", "started" (UTC, ISO 8601), "seconds", "git": {"commit", "dirty"},
"machine": {... at the start, "load_end"}, "parameters": {...}, "figures": {...}}.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import os
import platform
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"
DOCS = REPO / "docs"

Record = dict[str, Any]
#: names the commit a copy of the tree without .git was taken at (see git_facts)
COMMIT_ENV = "SPECDEPLOY_COMMIT"
EXCLUDED_FROM_DIRTY = (":(exclude)docs", ":(exclude)benchmarks/results")
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


SERVER_DOC, OPERATOR_DOC, CLUSTER_DOC, RELIABILITY_DOC = (
    DOCS / "benchmarks-server.md",
    DOCS / "benchmarks.md",
    DOCS / "local-cluster.md",
    DOCS / "reliability.md",
)
SERVER_SECTIONS = (
    "orchestration",
    "assisted",
    "http-stream",
    "concurrency",
    "loop-lag",
    "structured",
    "load-sweep",
)
#: the sections of benchmarks/server/gpu_day.py, whose records are server-gpu-<section>
GPU_SECTIONS = ("reference-1b", "assisted", "http", "structured", "reference-8b")


def _server_block(number: int, section: str) -> Block:
    return Block(
        f"server-{section}",
        SERVER_DOC,
        (f"server-{section}",),
        f"benchmarks.server.render:{section.replace('-', '_')}",
        f"python -m benchmarks.server --only {number}",
    )


def _timing_names() -> tuple[str, ...]:
    from benchmarks import timings  # noqa: PLC0415

    return tuple(timings.record_name(m.name) for m in timings.MEASUREMENTS)


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
            CLUSTER_DOC,
            _timing_names(),
            "benchmarks.timings:render",
            "make measure NAME=<measurement>",
            partial=True,
        ),
    ]


# Docs whose tables are all measured figures (None), or whose tables under the given heading are.
MEASURED_REGIONS: dict[Path, str | None] = {
    SERVER_DOC: None,
    OPERATOR_DOC: None,
    CLUSTER_DOC: "## Measured times",
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


# ------------------------------------------------------------------------------------------ records


def record_path(name: str, results: Path = RESULTS) -> Path:
    return results / f"{name}.json"


def load(name: str, results: Path = RESULTS) -> Record | None:
    path = record_path(name, results)
    if not path.exists():
        return None
    record: Record = json.loads(path.read_text())
    return record


def save(record: Record, results: Path = RESULTS) -> Path:
    results.mkdir(parents=True, exist_ok=True)
    path = record_path(str(record["name"]), results)
    path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return path


def command_line(argv: Sequence[str]) -> str:
    return shlex.join(argv)


def git_facts(repo: Path = REPO) -> dict[str, Any]:
    """The commit, and whether the code differs from it: changes under docs/ and benchmarks/results/ (which
    the measuring commands write themselves) and untracked files do not count."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
        ).stdout.strip()

    try:
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", *EXCLUDED_FROM_DIRTY)
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(changed)}
    except (OSError, subprocess.CalledProcessError):
        # a copy of the tree without its history (a machine lent for a measurement): the commit it was copied
        # at, as the copier says; whether the copy differs from it is then unknown
        return {"commit": os.environ.get(COMMIT_ENV) or None, "dirty": None}


def _cpu_model() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def _memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def load_average() -> float:
    return round(os.getloadavg()[0], 2)


def machine_facts(**extra: str) -> dict[str, Any]:
    """What the figures depend on: the machine and, through `extra`, the versions that matter (torch, Go ...).
    `load_start` is the 1-minute load average now; `finish` adds `load_end`."""
    return {
        "cpu_model": _cpu_model(),
        "cpu_cores": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "system": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
        "load_start": load_average(),
        **extra,
    }


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def new_record(
    name: str, command: str, started: dt.datetime, machine: Mapping[str, Any], parameters: Mapping[str, Any]
) -> Record:
    """A record whose figures are still to be filled in (`finish`)."""
    return {
        "name": name,
        "command": command,
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": None,
        "git": git_facts(),
        "machine": dict(machine),
        "parameters": dict(parameters),
        "figures": None,
    }


def finish(record: Record, started: dt.datetime, figures: Any) -> Record:
    record["seconds"] = round((now() - started).total_seconds(), 1)
    record["machine"]["load_end"] = load_average()
    record["figures"] = figures
    return record


# --------------------------------------------------------------------------------------- rendering


def provenance(record: Record) -> str:
    """Where a record's figures come from, as one sentence for the docs."""
    m, git = record["machine"], record["git"]
    when = record["started"].replace("T", " ")[:16] + " UTC"
    commit = f"`{git['commit'][:10]}`" if git.get("commit") else "an unknown commit"
    if git.get("dirty"):
        commit += " with uncommitted changes"
    versions = ", ".join(f"{k} {v}" for k, v in sorted(m.items()) if k not in _MACHINE_KEYS and v is not None)
    memory = f", {m['memory_gib']:g} GiB memory" if m.get("memory_gib") else ""
    cpu = f" ({m['cpu_model']})" if m.get("cpu_model") else ""
    return (
        f"Measured {when} by `{record['command']}` at {commit} (record "
        f"[`benchmarks/results/{record['name']}.json`](../benchmarks/results/{record['name']}.json), "
        f"{record['seconds']:.0f} s in all). Machine: {m['cpu_cores']} CPU cores{cpu}{memory}, "
        f"{m['system']}, Python {m['python']}{', ' + versions if versions else ''}; 1-minute load average "
        f"{m['load_start']:.1f} at the start and {m.get('load_end', float('nan')):.1f} at the end "
        "(the machine is shared: other people's builds and tests may have run during the measurement; the "
        "load at the end includes the measurement's own processes)."
    )


_MACHINE_KEYS = {"cpu_model", "cpu_cores", "memory_gib", "system", "python", "load_start", "load_end"}


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
    args = parser.parse_args(argv)
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
