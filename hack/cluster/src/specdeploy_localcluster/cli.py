"""The harness's command line, `python -m specdeploy_localcluster up|down|status|manifests|kwok-config` (what
`make cluster-up` and `make cluster-down` run). `down` and `status` need only the standard library: from
hack/cluster/src, any Python runs them, without the virtualenv."""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
import urllib.error
from pathlib import Path

from specdeploy_localcluster import cluster as cluster_module
from specdeploy_localcluster.cluster import AUTOSCALING_ENV, LWS_ENV, ClusterError, LocalCluster
from specdeploy_localcluster.controlplane import kwok_stages
from specdeploy_localcluster.nodepools import DEFAULT_NODEPOOLS, NodePoolError, load_nodepools, node_manifests


def status(cluster: LocalCluster, autoscaling: bool | None, lws: bool | None) -> int:
    """Print each component, running or stopped; 0 when the cluster is healthy."""
    running = cluster._running()
    # A running cluster's own settings (state.json), whatever this environment says.
    if autoscaling is None and "autoscaling" in cluster.state():
        cluster.autoscaling = bool(cluster.state()["autoscaling"])
    if lws is None and "lws" in cluster.state():
        cluster.lws = bool(cluster.state()["lws"])
    for name in cluster.components:
        print(f"{name:<24} {'running pid ' + str(running[name]) if name in running else 'stopped'}")
    return 0 if cluster.healthy() else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(cluster_module.__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "command",
        choices=["up", "down", "status", "manifests", "kwok-config"],
        help="manifests: print the node pools' Node objects (for `kubectl apply -f -` on another cluster); "
        "kwok-config: print the kwok Stages",
    )
    parser.add_argument("--dir", type=Path, default=Path(".cluster"), help="state directory")
    parser.add_argument("--nodepools", type=Path, default=DEFAULT_NODEPOOLS, help="node pools YAML")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument(
        "--autoscaling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run the custom metrics adapter and the Cluster Autoscaler "
        f"(default: on unless {AUTOSCALING_ENV}=0)",
    )
    parser.add_argument(
        "--lws",
        action=argparse.BooleanOptionalAction,
        default=None,
        help=f"run the LeaderWorkerSet controller (default: on unless {LWS_ENV}=0)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    cluster = LocalCluster(args.dir, nodepools=args.nodepools, autoscaling=args.autoscaling, lws=args.lws)
    try:
        if args.command == "up":
            started = time.monotonic()
            cluster.up(timeout=args.timeout)
            print(f"local cluster ready in {time.monotonic() - started:.1f}s")
            print(f"  export KUBECONFIG={cluster.kubeconfig}")
        elif args.command == "down":
            cluster.down()
        elif args.command == "status":
            return status(cluster, args.autoscaling, args.lws)
        elif args.command == "manifests":
            items = node_manifests(load_nodepools(args.nodepools))
            print(json.dumps({"apiVersion": "v1", "kind": "List", "items": items}, indent=2))
        elif args.command == "kwok-config":
            print(kwok_stages())
    except (ClusterError, NodePoolError, subprocess.CalledProcessError, urllib.error.URLError) as err:
        print(f"localcluster {args.command}: {err}", file=sys.stderr)
        return 1
    return 0
