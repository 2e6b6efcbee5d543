"""The demo's models, made inside the cluster by the manifests `make demo` applies (hack/demo-models.yaml): a
claim from the default StorageClass and a Job the pod runner runs for real. Tests and benchmarks train
briefly."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Protocol

import yaml

from specdeploy_localcluster.paths import CHECKOUT

MODELS_MANIFEST = CHECKOUT / "hack" / "demo-models.yaml"


class Kubectl(Protocol):
    """kubectl against the cluster, raising on failure (the tests' fixture, a benchmark's wrapper)."""

    def __call__(self, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]: ...


def make_demo_models(kubectl: Kubectl, namespace: str, steps: int) -> Path:
    """Run the models Job in `namespace` with `steps` training steps; returns the claim's directory on this
    machine (`target/` and `draft/` inside)."""
    docs = list(yaml.safe_load_all(MODELS_MANIFEST.read_text()))
    job = next(d for d in docs if d["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    container["command"] = [*container["command"], "--steps", str(steps)]
    kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs))
    kubectl("wait", "-n", namespace, "--for=condition=complete", "job/demo-models", "--timeout=300s")
    volume = kubectl("get", "pvc", "demo-models", "-n", namespace, "-o", "jsonpath={.spec.volumeName}").stdout
    path = kubectl("get", "pv", volume, "-o", "jsonpath={.spec.hostPath.path}").stdout
    return Path(path)
