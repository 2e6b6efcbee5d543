"""The reliability campaign (`make chaos`): hostile input, overload, disconnects, slow clients and a soak
against one real server process; writes benchmarks/results/reliability-server.json and the table of
docs/reliability.md (benchmarks/records.py).

python -m benchmarks.reliability              # the whole campaign (about 16 minutes on 2 CPU cores)
python -m benchmarks.reliability --quick      # smaller counts and a 30 s soak, for a smoke check
python -m benchmarks.reliability --no-write   # print only: no record, docs untouched
python -m benchmarks.reliability --only overload   # one scenario (repeat --only for more) and the server
                                                   # log check; prints only (a partial run writes no record)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from benchmarks import records
from benchmarks.reliability import report, scenarios
from benchmarks.reliability.server import ServerSettings, served

RECORD = "reliability-server"
NOTES = [
    "The server runs as `specdeploy-server` in its own process on the reference backend with tiny "
    "random-weight Llama checkpoints (target + smaller draft, speculative decoding on) on CPU: the figures "
    "measure the HTTP layer, the scheduler and the request lifecycle, not a GPU model's speed.",
    "uvicorn sets no deadline for a request's headers: a slowloris connection stays open as long as it "
    "trickles (until its headers pass h11's 16 KiB limit); each one costs a descriptor and a few KiB, "
    "not other clients' time. Put a proxy with header timeouts in front where clients are untrusted.",
]

#: the scenarios, in the order they run (the server log check runs last, always)
SCENARIOS = ("contract", "oversized", "overload", "disconnects", "slow-clients", "soak")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.reliability", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="smaller counts, a 30 s soak")
    parser.add_argument("--no-write", action="store_true", help="print only: no record, docs untouched")
    parser.add_argument(
        "--only",
        action="append",
        choices=SCENARIOS,
        metavar="NAME",
        help=f"run this scenario (and the server log check) only, printing its row: {', '.join(SCENARIOS)}",
    )
    args = parser.parse_args(argv)
    sizes = scenarios.Sizes.quick() if args.quick else scenarios.Sizes()
    settings = ServerSettings()
    import torch  # noqa: PLC0415

    started = records.now()
    record = records.new_record(
        RECORD,
        records.command_line(["python", "-m", "benchmarks.reliability", *argv]),
        started,
        records.machine_facts(torch=torch.__version__),
        {"sizes": dataclasses.asdict(sizes), "server": dataclasses.asdict(settings)},
    )
    results: list[report.ScenarioResult] = []
    work = tempfile.TemporaryDirectory(prefix="specdeploy-chaos-")
    with work as tmp, served(Path(tmp), settings) as server:
        steps: dict[str, Callable[[], report.ScenarioResult]] = {
            "contract": lambda: scenarios.contract(server, sizes.fuzz_examples),
            "oversized": lambda: scenarios.oversized(server, settings),
            "overload": lambda: scenarios.overload(server, settings, sizes.flood),
            "disconnects": lambda: scenarios.disconnects(server, settings, sizes.disconnects),
            "slow-clients": lambda: scenarios.slow_clients(server, sizes.slow_connections),
            "soak": lambda: scenarios.soaked(server, sizes.soak_seconds),
        }
        assert tuple(steps) == SCENARIOS
        steps["log"] = lambda: scenarios.server_log(server)  # always, last
        for name, step in steps.items():
            if args.only and name not in args.only and name != "log":
                continue
            result = step()
            results.append(result)
            print(f"{'pass' if result.passed else 'FAIL'}  {result.scenario}: {result.summary}", flush=True)
            for problem in result.problems[:5]:
                print(f"      {problem}", flush=True)
    records.finish(record, started, {"scenarios": [r.as_row() for r in results], "notes": NOTES})
    print(report.render([record]))
    if not args.no_write and not args.only:
        path = records.save(record)
        docs = records.update_docs([RECORD])
        print(f"wrote {path.relative_to(records.REPO)}; {', '.join(str(d) for d in docs) or 'docs current'}")
    return 0 if all(r.passed for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
