"""`make demo`'s pod table, from `kubectl get pods -o json` on stdin: phase, node, the pod's effective GPU
request (as the scheduler counts it: the larger of any init container's and the sum of the containers'), and
whether the pod runs for real (the local cluster's pod runner) or is simulated (kwok)."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import Any

GPU = "nvidia.com/gpu"


def gpus(container: Mapping[str, Any]) -> int:
    return int(((container.get("resources") or {}).get("requests") or {}).get(GPU, 0))


def effective_gpus(spec: Mapping[str, Any]) -> int:
    return max(
        [sum(gpus(c) for c in spec["containers"]), *(gpus(c) for c in spec.get("initContainers") or [])]
    )


def main() -> int:
    print(f"   {'POD':<58} {'STATUS':<10} {'NODE':<9} {'GPUS':>4}  RUNS")
    for pod in json.load(sys.stdin)["items"]:
        spec, status = pod["spec"], pod.get("status") or {}
        first = (status.get("containerStatuses") or [{}])[0]
        runs = "real process" if str(first.get("containerID", "")).startswith("podrunner://") else "simulated"
        name, phase, node = pod["metadata"]["name"], status.get("phase", ""), spec.get("nodeName", "")
        print(f"   {name:<58} {phase:<10} {node:<9} {effective_gpus(spec):>4}  {runs}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
