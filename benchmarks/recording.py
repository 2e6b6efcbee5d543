"""A record: what a measuring command writes, benchmarks/results/<name>.json, and what it says about where its
figures come from. Layout: {"name", "command", "started" (UTC, ISO 8601), "seconds", "git": {"commit",
"dirty"}, "code": {<measured path>: <its git tree or blob hash as measured>}, "machine": {... at the start,
"load_end"}, "parameters": {...}, "figures": {...}}. The measured paths are declared per record in
measured_paths.py.

A command makes its record with `new_record`, fills it in with `finish` and writes it with `save`; renderers
of the docs' blocks (records.py) cite it with `provenance`. Nothing here knows the docs."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import shlex
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.measured_paths import measured_paths

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"

Record = dict[str, Any]
#: names the commit a copy of the tree without .git was taken at (see git_facts)
COMMIT_ENV = "SPECDEPLOY_COMMIT"
EXCLUDED_FROM_DIRTY = (":(exclude)docs", ":(exclude)benchmarks/results")


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


def code_facts(paths: Sequence[str], repo: Path = REPO) -> dict[str, str | None]:
    """The git hash of each of `paths` as the working tree has it now (uncommitted changes and untracked files
    that git does not ignore included): a tree for a directory, a blob for a file, None for a path git does
    not have. Computed through a scratch index, so the repository's own index is untouched. All None in a
    copy of the tree without its history."""
    if not paths:
        return {}
    with tempfile.TemporaryDirectory(prefix="specdeploy-code-") as scratch:
        env = {**os.environ, "GIT_INDEX_FILE": str(Path(scratch) / "index")}

        def git(*args: str) -> str:
            return subprocess.run(
                ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env
            ).stdout.strip()

        try:
            git("read-tree", "HEAD")
            git("add", "--all", "--", *(p for p in paths if (repo / p).exists()))
            tree = git("write-tree")
        except (OSError, subprocess.CalledProcessError):
            return dict.fromkeys(paths)
        return {path: tree_hash(tree, path, repo) for path in paths}


def tree_hash(revision: str, path: str, repo: Path = REPO) -> str | None:
    """The hash of `path` in `revision` (a commit or a tree), None when it has no such path."""
    out = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{revision}:{path}"],
        capture_output=True,
        text=True,
        check=False,
    )
    return out.stdout.strip() or None


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
    """A record whose figures are still to be filled in (`finish`), with the hashes of what it measures."""
    return {
        "name": name,
        "command": command,
        "started": started.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "seconds": None,
        "git": git_facts(),
        "code": code_facts(measured_paths(name)),
        "machine": dict(machine),
        "parameters": dict(parameters),
        "figures": None,
    }


def finish(record: Record, started: dt.datetime, figures: Any) -> Record:
    record["seconds"] = round((now() - started).total_seconds(), 1)
    record["machine"]["load_end"] = load_average()
    record["figures"] = figures
    return record


def provenance(record: Record) -> str:
    """Where a record's figures come from, as one sentence for the docs. The load averages are the machine's,
    which is shared: other work may have run during the measurement, and the load at the end includes the
    measurement's own processes."""
    m, git = record["machine"], record["git"]
    when = record["started"].replace("T", " ")[:16] + " UTC"
    commit = f"`{git['commit'][:10]}`" if git.get("commit") else "an unknown commit"
    if git.get("dirty"):
        commit += " with uncommitted changes"
    versions = ", ".join(f"{k} {v}" for k, v in sorted(m.items()) if k not in _MACHINE_KEYS and v is not None)
    memory = f", {m['memory_gib']:g} GiB" if m.get("memory_gib") else ""
    cpu = f" ({m['cpu_model']})" if m.get("cpu_model") else ""
    return (
        f"Measured {when} by `{record['command']}` at {commit} "
        f"([record](../benchmarks/results/{record['name']}.json), {record['seconds']:.0f} s) on "
        f"{m['cpu_cores']} CPU cores{cpu}{memory}, {m['system']}, Python {m['python']}"
        f"{', ' + versions if versions else ''}; shared machine, 1-minute load {m['load_start']:.1f} → "
        f"{m.get('load_end', float('nan')):.1f}."
    )


_MACHINE_KEYS = {"cpu_model", "cpu_cores", "memory_gib", "system", "python", "load_start", "load_end"}
