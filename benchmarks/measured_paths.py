"""What each record measures: the paths of the repository whose code its figures depend on. A record stores
the git tree (or blob) hash of each of its paths as measured (recording.code_facts); `python -m
benchmarks.records --stale` lists the records whose paths changed since. The standard library only."""

from __future__ import annotations

#: the sections of benchmarks/server, whose records are server-<section>
SERVER_SECTIONS = (
    "orchestration",
    "assisted",
    "http-stream",
    "concurrency",
    "loop-lag",
    "structured",
    "load-sweep",
    "predicted",
)
#: the sections of benchmarks/server/gpu_day.py, whose records are server-gpu-<section>
GPU_SECTIONS = ("reference-1b", "assisted", "http", "structured", "reference-8b")

_SERVER = ("server/src", "benchmarks/server")
_OPERATOR = ("operator/src", "hack/cluster", "benchmarks/operator")
_BUILD = ("hack/cluster/build.sh", "hack/cluster/versions.env", "hack/cluster/gomod")
_WHOLE = ("Makefile", ".ci", "pyproject.toml", "operator", "server", "hack", "charts", "crds", "tests")

BY_RECORD: dict[str, tuple[str, ...]] = {
    **{f"server-{section}": _SERVER for section in SERVER_SECTIONS},
    **{f"server-gpu-{section}": _SERVER for section in GPU_SECTIONS},
    "autoscaling": ("operator/src", "server/src", "hack/cluster", "benchmarks/autoscaling.py"),
    "distill": ("operator/src", "server/src", "hack/cluster", "benchmarks/distill.py"),
    "operator": _OPERATOR,
    "operator-1000": _OPERATOR,
    "operator-multinode": _OPERATOR,
    "memory": ("server/src", "hack/cluster", "benchmarks/memory.py"),
    "reliability-server": ("server/src", "benchmarks/reliability"),
    "reliability-operator": ("operator/src", "hack/cluster", "benchmarks/operator_faults"),
    "timing-build-cold": _BUILD,
    "timing-build-warm": _BUILD,
    "timing-cluster": ("hack/cluster", "Makefile"),
    "timing-cluster-no-autoscaling": ("hack/cluster", "Makefile"),
    "timing-test-server": ("server", "tests/server"),
    "timing-test-cluster": ("hack/cluster", "tests/conftest.py", "tests/integration/test_cluster.py"),
    "timing-test-real-pods": (
        "operator/src",
        "server/src",
        "hack/cluster",
        "tests/conftest.py",
        "tests/integration/test_real_pods.py",
    ),
    "timing-demo": ("operator/src", "server/src", "hack", "examples", "Makefile"),
    "timing-demo-cold": _WHOLE,
    "timing-test-warm": _WHOLE,
    "timing-test-loaded": _WHOLE,
    "timing-ci-cold": _WHOLE,
}


def measured_paths(record: str) -> tuple[str, ...]:
    """The paths the record `record` measures; none for a name declared nowhere (a test's own record)."""
    return BY_RECORD.get(record, ())
