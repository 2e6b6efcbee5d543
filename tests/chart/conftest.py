"""Fixtures of the Helm chart tests.

The offline tests (lint, template, schema, Dockerfiles) need only the `helm` binary the cluster harness
builds; the tests marked ``integration`` use the real-cluster fixtures of tests/conftest.py (the same
session cluster as tests/integration: a private local cluster, or ``USE_EXISTING_CLUSTER=1``)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import pytest
import yaml
from specdeploy_localcluster.cluster import LocalCluster

__all__ = [
    "CHART",
    "KUBE_VERSION",
    "KUBE_VERSION_FLOOR",
    "REPO",
    "Helm",
    "render",
]

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "specdeploy"
# The Kubernetes version the project pins (hack/cluster/versions.env) and validates the manifests against.
KUBE_VERSION = "1.35.4"


def _chart_floor() -> str:
    """The oldest Kubernetes the chart installs on: its `kubeVersion: ">=X.Y.Z-0"`, as X.Y.Z."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    constraint = str(chart["kubeVersion"])
    assert constraint.startswith(">="), constraint
    assert constraint.endswith("-0"), constraint
    return constraint.removeprefix(">=").removesuffix("-0")


# The floor is validated too: the manifests must be valid for the oldest Kubernetes the chart admits.
KUBE_VERSION_FLOOR = _chart_floor()


class Helm(Protocol):
    def __call__(
        self, *args: str, check: bool = True, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]: ...


@pytest.fixture(scope="session")
def helm_bin() -> str:
    """`helm` from $HELM, else the harness's pinned build (hack/cluster/build.sh; a cache hit is instant)."""
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    return str(LocalCluster(Path(tempfile.gettempdir()) / "specdeploy-unused").bin_dir / "helm")


@pytest.fixture(scope="session")
def helm(helm_bin: str, tmp_path_factory: pytest.TempPathFactory) -> Helm:
    # Helm's own state (repository cache, config) kept out of the user's home.
    home = tmp_path_factory.mktemp("helm-home")
    env = {
        **os.environ,
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    env.pop("KUBECONFIG", None)

    def run(
        *args: str, check: bool = True, kubeconfig: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [helm_bin, *args]
        if kubeconfig is not None:
            argv.append(f"--kubeconfig={kubeconfig}")
        proc = subprocess.run(argv, env=env, capture_output=True, text=True, check=False, timeout=300)
        if check and proc.returncode != 0:
            raise AssertionError(
                f"helm {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    return run


def render(
    helm: Helm,
    *,
    values: Sequence[Path] = (),
    sets: Sequence[str] = (),
    namespace: str = "specdeploy-system",
    kube_version: str = KUBE_VERSION,
) -> list[dict[str, Any]]:
    """`helm template` of the chart (CRDs included) for `kube_version`, as a list of objects."""
    args = ["template", "specdeploy", str(CHART), "--namespace", namespace, "--include-crds"]
    args += ["--kube-version", kube_version]
    for path in values:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    out = helm(*args).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]
