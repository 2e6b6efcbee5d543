"""The shells the README tests run commands in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Kubectl
from tests.docs.readme_shell import Shell


@pytest.fixture
def shell(tmp_path: Path) -> Iterator[Shell]:
    env = {k: v for k, v in os.environ.items() if k not in {"KUBECONFIG", "MAKEFLAGS", "MFLAGS", "MAKELEVEL"}}
    helm_home = tmp_path / "helm"
    env |= {
        "HELM_CACHE_HOME": str(helm_home / "cache"),
        "HELM_CONFIG_HOME": str(helm_home / "config"),
        "HELM_DATA_HOME": str(helm_home / "data"),
        "PYTEST_ADDOPTS": f"--basetemp={tmp_path / 'nested-pytest'} -p no:cacheprovider",
        # kubectl's discovery cache is per host:port: one an earlier cluster left on the same port lacks the
        # CRDs for a while.
        "KUBECACHEDIR": str(tmp_path / "kube-cache"),
    }
    sh = Shell(env)
    yield sh
    for proc in sh.started:
        sh.stop(proc)


@pytest.fixture
def cluster_shell(shell: Shell, kubectl: Kubectl, tmp_path: Path) -> Shell:
    """The shell after the README's `export` line, pointed at a copy of the session cluster's kubeconfig."""
    copy = tmp_path / "kubeconfig"
    copy.write_text(kubectl("config", "view", "--flatten", "--raw").stdout)
    copy.chmod(0o600)
    after = shell.export("export KUBECONFIG=$PWD/.cluster/kubeconfig PATH=$(hack/cluster/build.sh):$PATH", {
        "$PWD/.cluster/kubeconfig": str(copy)
    })  # fmt: skip
    assert after.env["KUBECONFIG"] == str(copy)
    bins = Path(after.env["PATH"].split(":")[0])
    assert (bins / "kubectl").is_file(), f"no kubectl in {bins}"
    assert (bins / "helm").is_file(), f"no helm in {bins}"
    return after
