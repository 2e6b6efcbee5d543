"""Pod Security "restricted" and refused pods on the local cluster's real API server (PodSecurity,
ResourceQuota and LimitRanger admission are on by default in kube-apiserver; the controller-manager's quota
controller keeps quota usage current).

- the offline checker (tests/pod_security_standards.py) and the API server agree: every pod the operator
  renders for every example is admitted in an enforcing namespace, and each broken rule is refused by both;
- in an enforcing namespace an example builds and serves for real (examples/09: the pod runner runs its
  server as the pods' non-root user) and a GPU example builds and rolls out (kwok-simulated pods);
- a GPU ResourceQuota that refuses a replica (or a build pod) shows in status within seconds, with the API
  server's message and an event, and clears once the quota is raised.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException
from specdeploy_localcluster.demomodels import make_demo_models
from specdeploy_operator.api import SpeculativeDeployment, parse_object
from specdeploy_operator.builders import OperatorSettings, render_children

from tests.chart.test_pod_security_restricted import MUTATIONS
from tests.conftest import OPERATOR_NAMESPACE_PREFIX, Kubectl, fresh_namespace, wait_for
from tests.example_files import example_files
from tests.pod_security_standards import pod_specs, violations

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = example_files()
GROUP, VERSION, PLURAL = "specdeploy.dev", "v1alpha1", "speculativedeployments"
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}

pytestmark = pytest.mark.usefixtures("operator")


def example_doc(prefix: str) -> dict[str, Any]:
    path = next(p for p in EXAMPLES if p.name.startswith(prefix))
    doc: dict[str, Any] = next(d for d in yaml.safe_load_all(path.read_text()) if d)
    return doc


@pytest.fixture
def restricted_namespace(core: client.CoreV1Api) -> Iterator[str]:
    """A namespace the session's operator watches, enforcing Pod Security `restricted`."""
    with fresh_namespace(core, OPERATOR_NAMESPACE_PREFIX) as name:
        core.patch_namespace(name, {"metadata": {"labels": RESTRICTED}})
        yield name


@pytest.fixture
def watched_namespace(core: client.CoreV1Api) -> Iterator[str]:
    with fresh_namespace(core, OPERATOR_NAMESPACE_PREFIX) as name:
        yield name


def dry_run_pod(kubectl: Kubectl, namespace: str, spec: dict[str, Any]) -> str | None:
    """None when the API server would create a pod of `spec` (server-side dry run: admission runs, nothing is
    stored), else its refusal."""
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p-{uuid.uuid4().hex[:8]}"},
        "spec": spec,
    }
    out = kubectl(
        "create", "--dry-run=server", "-n", namespace, "-f", "-", input=json.dumps(body), check=False
    )
    if out.returncode == 0:
        return None
    assert "Forbidden" in out.stderr, out.stderr
    return out.stderr


def test_the_offline_checker_and_the_api_server_agree(kubectl: Kubectl, restricted_namespace: str) -> None:
    admitted = 0
    for path in EXAMPLES:
        for doc in yaml.safe_load_all(path.read_text()):
            if not doc or doc.get("kind") != "SpeculativeDeployment":
                continue
            sdep = parse_object(doc)
            assert isinstance(sdep, SpeculativeDeployment)
            for obj in render_children(sdep, OperatorSettings()):
                for where, spec in pod_specs(obj):
                    assert violations(spec) == []
                    assert dry_run_pod(kubectl, restricted_namespace, dict(spec)) is None, (
                        f"{path.name} {where}"
                    )
                    admitted += 1
    assert admitted >= 2 * len(EXAMPLES)
    first = parse_object(example_doc("01"))
    assert isinstance(first, SpeculativeDeployment)
    deployment = next(o for o in render_children(first) if o["kind"] == "Deployment")
    for name, (mutate, rule) in MUTATIONS.items():
        mutated: dict[str, Any] = copy.deepcopy(deployment["spec"]["template"]["spec"])
        mutate(mutated)
        refusal = dry_run_pod(kubectl, restricted_namespace, mutated)
        assert refusal is not None, f"{name}: the API server admitted it"
        assert "violates PodSecurity" in refusal
        assert rule in refusal, (name, refusal)
        assert rule in violations(mutated), name


class Sdeps:
    def __init__(self, api: client.ApiClient, kubectl: Kubectl, namespace: str) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.kubectl = kubectl
        self.namespace = namespace

    def apply(self, doc: dict[str, Any]) -> str:
        doc = json.loads(json.dumps(doc))
        doc["metadata"]["namespace"] = self.namespace
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(doc))
        return str(doc["metadata"]["name"])

    def status(self, name: str) -> dict[str, Any]:
        obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL, name)
        return dict(obj.get("status") or {})

    def condition(self, name: str, type_: str) -> dict[str, Any]:
        return next((c for c in self.status(name).get("conditions") or () if c["type"] == type_), {})

    def wait_ready(self, name: str, timeout: float = 240) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            status = self.status(name)
            return status if status.get("phase") == "Ready" else None

        result: dict[str, Any] = wait_for(ready, timeout=timeout, interval=0.5, what=f"{name} Ready")
        return result

    def warnings(self, name: str) -> list[Any]:
        events = self.core.list_namespaced_event(
            self.namespace,
            field_selector=f"involvedObject.name={name},involvedObject.kind=SpeculativeDeployment",
        ).items
        return [e for e in events if e.type == "Warning"]


def test_an_example_builds_and_serves_in_a_restricted_namespace(
    kubectl: Kubectl, api_client: client.ApiClient, restricted_namespace: str
) -> None:
    sdeps = Sdeps(api_client, kubectl, restricted_namespace)
    # Real pods: the demo's models Job, the staging Jobs and the CPU server, run by the pod runner.
    make_demo_models(kubectl, restricted_namespace, steps=40)
    name = sdeps.apply(example_doc("09"))
    status = sdeps.wait_ready(name)
    [pod] = sdeps.core.list_namespaced_pod(restricted_namespace, label_selector=status["selector"]).items
    assert pod.status.container_statuses[0].container_id.startswith("podrunner://")
    pid = int(pod.status.container_statuses[0].container_id.removeprefix("podrunner://"))
    uids = next(
        line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:")
    )
    assert uids.split()[1:] == ["10001"] * 4, uids  # the server process runs as the pod's user
    # A GPU example: build Jobs and serving pods (simulated by kwok) are admitted and reach Ready.
    gpu = sdeps.apply(example_doc("01"))
    status = sdeps.wait_ready(gpu)
    assert status["readyText"] == "1/1"
    assert {e["phase"] for e in (status["engines"]["target"], status["engines"]["draft"])} == {"Succeeded"}


def set_quota(core: client.CoreV1Api, namespace: str, gpus: int) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "gpus"},
        "spec": {"hard": {"requests.nvidia.com/gpu": str(gpus)}},
    }
    try:
        core.replace_namespaced_resource_quota("gpus", namespace, body)
    except ApiException as err:
        if err.status != 404:
            raise
        core.create_namespaced_resource_quota(namespace, body)


def test_a_gpu_quota_that_refuses_a_replica_shows_in_status_and_clears_when_raised(
    kubectl: Kubectl, api_client: client.ApiClient, watched_namespace: str
) -> None:
    sdeps = Sdeps(api_client, kubectl, watched_namespace)
    set_quota(sdeps.core, watched_namespace, 2)
    name = sdeps.apply(example_doc("01"))  # 2 GPUs per replica
    assert sdeps.wait_ready(name)["gpusPerReplica"] == 2
    sdeps.custom.patch_namespaced_custom_object(
        GROUP, VERSION, watched_namespace, PLURAL, name, {"spec": {"replicas": 2}}
    )

    def refused() -> dict[str, Any] | None:
        degraded = sdeps.condition(name, "Degraded")
        return degraded if degraded.get("reason") == "QuotaExceeded" else None

    degraded = wait_for(refused, timeout=60, interval=0.25, what="Degraded QuotaExceeded")
    assert degraded["status"] == "True"
    assert "exceeded quota: gpus" in degraded["message"]
    assert "requests.nvidia.com/gpu" in degraded["message"]
    assert sdeps.status(name)["phase"] == "Degraded"
    warning = wait_for(
        lambda: [e for e in sdeps.warnings(name) if e.reason == "QuotaExceeded"],
        timeout=30,
        what="the QuotaExceeded warning event",
    )
    assert "exceeded quota" in warning[0].message
    set_quota(sdeps.core, watched_namespace, 4)
    status = sdeps.wait_ready(name, timeout=180)
    assert status["readyText"] == "2/2"
    assert sdeps.condition(name, "Degraded")["status"] == "False"


def test_a_build_pod_the_quota_refuses_shows_on_the_engine_build_and_the_deployment(
    kubectl: Kubectl, api_client: client.ApiClient, watched_namespace: str
) -> None:
    sdeps = Sdeps(api_client, kubectl, watched_namespace)
    set_quota(sdeps.core, watched_namespace, 0)
    name = sdeps.apply(example_doc("07"))  # one TP2 model: one build pod of 2 GPUs

    def blocked() -> dict[str, Any] | None:
        degraded = sdeps.condition(name, "Degraded")
        return degraded if degraded.get("reason") == "QuotaExceeded" else None

    degraded = wait_for(blocked, timeout=60, interval=0.25, what="Degraded QuotaExceeded while building")
    assert degraded["status"] == "True"
    assert "the build pod cannot be created" in degraded["message"]
    assert "exceeded quota: gpus" in degraded["message"]
    assert sdeps.status(name)["phase"] in ("Pending", "Building")
    engine = sdeps.status(name)["engines"]["target"]["name"]
    build = sdeps.custom.get_namespaced_custom_object(
        GROUP, VERSION, watched_namespace, "enginebuilds", engine
    )
    [succeeded] = build["status"]["conditions"]
    assert (build["status"]["phase"], succeeded["reason"]) == ("Pending", "QuotaExceeded")
    set_quota(sdeps.core, watched_namespace, 2)
    assert sdeps.wait_ready(name, timeout=180)["readyText"] == "1/1"
    assert sdeps.condition(name, "Degraded")["status"] == "False"
