"""Run the server benchmarks and write docs/benchmarks-server.md.

python -m benchmarks.server                 # all six (about 6-7 minutes on 2 CPU cores)
python -m benchmarks.server --only 1,3      # a subset
python -m benchmarks.server --quick         # shorter runs, for a smoke check
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[2] / "docs" / "benchmarks-server.md"
ALL = "1,2,3,4,5,6"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.server", description=__doc__)
    parser.add_argument("--only", default=ALL, help="comma-separated benchmark numbers")
    parser.add_argument("--quick", action="store_true", help="shorter runs")
    parser.add_argument("--output", type=Path, default=OUT, help="markdown file to write")
    args = parser.parse_args(argv)
    only = {int(x) for x in args.only.split(",") if x}
    sections: list[str] = []

    if 1 in only:
        from benchmarks.server import orchestration  # noqa: PLC0415

        results = orchestration.run(seconds=1.5 if args.quick else 4.0)
        sections.append(
            "## 1. Orchestration efficiency (stand-in executors)\n\n" + orchestration.table(results)
        )
        print(sections[-1], flush=True)
    if 2 in only:
        from benchmarks.server import assisted  # noqa: PLC0415

        res2 = assisted.run(prompts=4 if args.quick else 8, max_new=32 if args.quick else 64)
        sections.append(
            "## 2. Reference backend vs transformers assisted generation (CPU)\n\n" + assisted.table(res2)
        )
        print(sections[-1], flush=True)
    if 3 in only:
        from benchmarks.server import http_stream  # noqa: PLC0415

        res3 = http_stream.run(streams=8, tokens=500 if args.quick else 2000)
        sections.append("## 3. HTTP streaming throughput (instant engine)\n\n" + http_stream.table(res3))
        print(sections[-1], flush=True)
    if 4 in only:
        from benchmarks.server import concurrency  # noqa: PLC0415

        res4 = concurrency.run(requests=4 if args.quick else 8, max_new=32 if args.quick else 64)
        sections.append("## 4. Reference backend under concurrency (CPU)\n\n" + concurrency.table(res4))
        print(sections[-1], flush=True)

    if 5 in only:
        from benchmarks.server import loop_lag  # noqa: PLC0415

        res5 = loop_lag.run(requests=300 if args.quick else 1000, seconds=2.0 if args.quick else 5.0)
        sections.append(
            "## 5. Event-loop lag under HTTP work (stand-in executors)\n\n" + loop_lag.table(res5)
        )
        print(sections[-1], flush=True)

    if 6 in only:
        from benchmarks.server import structured  # noqa: PLC0415

        res6 = structured.run(requests=4 if args.quick else 12)
        sections.append(
            "## 6. Constrained generation with speculation vs without (CPU)\n\n" + structured.table(res6)
        )
        print(sections[-1], flush=True)

    import torch  # noqa: PLC0415
    import transformers  # noqa: PLC0415

    env = (
        f"Run {datetime.datetime.now(datetime.UTC).strftime('%Y-%m-%d %H:%M UTC')} on {platform.machine()}, "
        f"{os.cpu_count()} CPU cores, Python {sys.version.split()[0]}, torch {torch.__version__}, "
        f"transformers {transformers.__version__}; command: `python -m benchmarks.server"
        f"{' --quick' if args.quick else ''}{'' if args.only == ALL else ' --only ' + args.only}`."
    )
    existing = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
    header, _, earlier = existing.partition("<!-- results -->")
    if not header:
        header = "# Server benchmarks\n\n"
    if only != {int(x) for x in ALL.split(",")} and earlier:
        sections, env = _merge(earlier, sections, only, env)
    args.output.write_text(
        header + "<!-- results -->\n\n" + env + "\n\n" + "\n\n".join(sections) + "\n", encoding="utf-8"
    )
    print(f"wrote {args.output}")


def _merge(results: str, new: list[str], only: set[int], env: str) -> tuple[list[str], str]:
    """A partial run (``--only``) keeps the earlier run's other sections, in number order, and says which
    sections each run line covers."""
    parts = results.strip().split("\n## ")
    old_env = parts[0].strip()
    kept = {
        int(p.split(".", 1)[0]): "## " + p.strip() for p in parts[1:] if int(p.split(".", 1)[0]) not in only
    }
    fresh = {int(p[len("## ") :].split(".", 1)[0]): p for p in new}
    merged = [text for _, text in sorted({**kept, **fresh}.items())]
    done = ", ".join(str(n) for n in sorted(only))
    label = "Sections" if len(only) > 1 else "Section"
    return merged, f"{old_env}\n\n{label} {done}: {env[0].lower()}{env[1:]}"


if __name__ == "__main__":
    main()
