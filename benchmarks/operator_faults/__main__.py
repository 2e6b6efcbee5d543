"""`python -m benchmarks.operator_faults`: every scenario on a local cluster of its own, then the record."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

from specdeploy_localcluster.cluster import LocalCluster

from benchmarks import records

from . import REPO
from . import __doc__ as DOC
from .badstates import deleted_mid_build, long_names, rbac_forbidden, terminating_namespace
from .campaign import FAST_KILL_POINTS, KILL_POINTS, Campaign, Outcome
from .drift import drift
from .faults import control_plane_restart, kill_at, takeover
from .report import render


def run_all(c: Campaign, fast: bool = False) -> list[Outcome]:
    points = [(p, k) for p, k in KILL_POINTS if not fast or p in FAST_KILL_POINTS]
    outcomes = [kill_at(c, point, kind, i) for i, (point, kind) in enumerate(points)]
    outcomes.append(control_plane_restart(c, "kube-apiserver"))
    outcomes.append(control_plane_restart(c, "etcd"))
    outcomes.append(takeover(c))
    outcomes.append(deleted_mid_build(c))
    outcomes.append(long_names(c))
    outcomes.append(rbac_forbidden(c))
    outcomes.append(terminating_namespace(c))
    outcomes.extend(drift(c))
    return outcomes


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.operator_faults",
        description=DOC,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--no-write", action="store_true", help="print only: no record, docs untouched")
    parser.add_argument("--fast", action="store_true", help="the make-test subset of kill points")
    args = parser.parse_args(argv)
    started = records.now()
    record = records.new_record(
        "reliability-operator",
        records.command_line(["python", "-m", "benchmarks.operator_faults", *argv]),
        started,
        records.machine_facts(),
        {"fast": args.fast},
    )
    state = Path(tempfile.mkdtemp(prefix="specdeploy-chaos-"))
    cluster = LocalCluster(state, autoscaling=False)
    try:
        cluster.up(timeout=180)
        campaign = Campaign(cluster)
        campaign.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
        campaign.kubectl("wait", "--for=condition=Established", "--timeout=60s", "crd", "--all")
        outcomes = run_all(campaign, fast=args.fast)
    finally:
        cluster.down()
        shutil.rmtree(state, ignore_errors=True)
    records.finish(record, started, {"outcomes": [asdict(o) for o in outcomes]})
    print(render([record]))
    if not args.no_write:
        path = records.save(record)
        docs = records.update_docs([record["name"]])
        print(f"wrote {path.relative_to(REPO)} and {', '.join(str(d.relative_to(REPO)) for d in docs)}")
    return 0 if all(o.passed for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
