"""The operator at scale on the simulated GPU cluster: time to Ready, API requests, memory and CPU.

Writes its record and the block of docs/benchmarks.md rendered from it (benchmarks/operator/report.py,
benchmarks/records.py).

python -m benchmarks.operator                      # 100 deployments, 2 min steady state (~4 min)
python -m benchmarks.operator --count 1000         # 1 000 deployments (record operator-1000; ~20 min)
python -m benchmarks.operator --count 20 --steady 20 --no-write   # a smoke run: no record, docs untouched
python -m benchmarks.operator --multinode          # 100 deployments whose replicas span two nodes each

What one run does is in benchmarks/operator/run.py. API requests come from the apiserver's audit log (only
the operator's identity is audited) split by verb and resource, and from the operator's own counter
`specdeploy_operator_api_requests_total` (its writes); the operator's memory and CPU time from /proc.
"""

from __future__ import annotations

import argparse
import sys

from benchmarks import records
from benchmarks.operator import REPO
from benchmarks.operator.figures import figures
from benchmarks.operator.report import render
from benchmarks.operator.run import OPERATOR_ENV, run

RECORDS = {100: "operator", 1000: "operator-1000"}
"""The counts that have a record and a block of docs/benchmarks.md; other counts run with --no-write."""
MULTINODE_RECORDS = {100: "operator-multinode"}


def default_timeout(count: int) -> float:
    """Seconds to wait for all Ready: 10 minutes, more for more deployments (the cluster's controllers
    create their pods at a limited rate)."""
    return max(600.0, 1.5 * count)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.operator", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--count",
        type=int,
        default=100,
        help=f"SpeculativeDeployments to create (records: {', '.join(map(str, RECORDS))})",
    )
    parser.add_argument("--steady", type=float, default=120.0, help="seconds of steady state to watch")
    parser.add_argument("--timeout", type=float, help="seconds to wait for Ready (default: by --count)")
    parser.add_argument("--no-write", action="store_true", help="print only: no record, docs untouched")
    parser.add_argument("--keep", action="store_true", help="keep the cluster's directory (logs)")
    parser.add_argument(
        "--multinode",
        action="store_true",
        help="replicas that span two 8-GPU nodes (LeaderWorkerSet groups; record operator-multinode at 100)",
    )
    args = parser.parse_args(argv)
    name = (MULTINODE_RECORDS if args.multinode else RECORDS).get(args.count)
    if name is None and not args.no_write:
        counts = ", ".join(map(str, RECORDS))
        parser.error(f"--count {args.count} has no record ({counts} do): add --no-write")
    timeout = args.timeout if args.timeout is not None else default_timeout(args.count)
    started = records.now()
    record = records.new_record(
        name or f"operator-{args.count}",
        records.command_line(["python", "-m", "benchmarks.operator", *argv]),
        started,
        records.machine_facts(),
        {
            "count": args.count,
            "steady": args.steady,
            "timeout": timeout,
            "operator_env": OPERATOR_ENV,
            "multinode": args.multinode,
        },
    )
    results = run(args.count, args.steady, timeout, args.keep, multinode=args.multinode)
    records.finish(record, started, figures(results))
    print()
    print(render([record]))
    if not args.no_write:
        path = records.save(record)
        docs = records.update_docs([record["name"]])
        print(f"wrote {path.relative_to(REPO)} and {', '.join(str(d.relative_to(REPO)) for d in docs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
