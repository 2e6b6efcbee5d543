"""The operator against the real control plane: kwok completes build pods and runs serving pods.

Every test applies SpeculativeDeployments with kubectl, as a user would, and watches what the running
operator (`python -m specdeploy_operator`, a child process) does with them.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from specdeploy_localcluster.cluster import LocalCluster
from specdeploy_localcluster.operatorproc import OperatorProcess
from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.builders import OperatorSettings, build_engine_builds, build_job, job_name

from tests.conftest import (
    OPERATOR_NAMESPACE_PREFIX,
    Kubectl,
    fresh_namespace,
    wait_for,
    wait_quiet,
)
from tests.example_files import example_files, example_id

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = example_files()
# The GPU examples, whose pods kwok simulates. backend transformers runs for real where it can: examples/09
# (CPU) is served by the pod runner (tests/integration/test_real_pods.py); examples/10's staging Job really
# runs its hf:// download, which no model hub answers from here (test_real_pods.py checks the failure).
GPU_EXAMPLES = [p for p in EXAMPLES if yaml.safe_load(p.read_text())["spec"].get("backend") != "transformers"]
GROUP, VERSION = "specdeploy.dev", "v1alpha1"
PHASE_ORDER = ["Pending", "Building", "Deploying", "Ready"]
FAILING_IMAGE = "sim.specdeploy.dev/fail:latest"

pytestmark = pytest.mark.usefixtures("operator")


def load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(path.read_text())
    return doc


def example(prefix: str) -> dict[str, Any]:
    """The first example whose id (`02-…`, `tensorrt-02-…` for the engine builds) starts with `prefix`."""
    return load(next(p for p in EXAMPLES if example_id(p).startswith(prefix)))


class Cluster:
    """What a test needs: apply manifests, read objects, wait."""

    def __init__(self, kubectl: Kubectl, api: client.ApiClient, namespace: str) -> None:
        self.kubectl = kubectl
        self.namespace = namespace
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.batch = client.BatchV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.phases: dict[str, list[str]] = {}

    def apply(self, doc: dict[str, Any]) -> str:
        doc = copy.deepcopy(doc)
        doc["metadata"]["namespace"] = self.namespace
        name = str(doc["metadata"]["name"])
        for claim in sorted(set(re.findall(r"pvc://([a-z0-9-]+)/", json.dumps(doc)))):
            self.model_store(claim)
        self.kubectl("apply", "--server-side", "--force-conflicts", "-f", "-", input=json.dumps(doc))
        return name

    def model_store(self, claim: str) -> None:
        """A user's claim holding checkpoints (`pvc://<claim>/...` sources); the default StorageClass
        provisions it."""
        pvc = {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": self.namespace},
            "spec": {"accessModes": ["ReadOnlyMany"], "resources": {"requests": {"storage": "1Ti"}}},
        }
        self.kubectl("apply", "--server-side", "-f", "-", input=json.dumps(pvc))

    def sdep(self, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "speculativedeployments", name
        )
        return obj

    def status(self, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.sdep(name).get("status") or {}
        phase = status.get("phase")
        seen = self.phases.setdefault(name, [])
        if phase and (not seen or seen[-1] != phase):
            seen.append(phase)
        return status

    def wait_phase(
        self, name: str, phase: str, timeout: float = 90, since_generation: bool = True
    ) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            status = self.status(name)
            generation = self.sdep(name)["metadata"]["generation"]
            current = not since_generation or status.get("observedGeneration") == generation
            return status if status.get("phase") == phase and current else None

        def seen() -> str:
            engines = {e["metadata"]["name"]: e.get("status") for e in self.engine_builds()}
            jobs = {j.metadata.name: (j.status.succeeded, j.status.failed) for j in self.jobs()}
            return (
                f"phases seen: {self.phases.get(name)}\nstatus: {self.status(name)}\n"
                f"engine builds: {engines}\njobs (succeeded, failed): {jobs}"
            )

        result: dict[str, Any] = wait_for(
            reached, timeout=timeout, interval=0.2, what=f"{name} phase {phase}", describe=seen
        )
        return result

    def engine_builds(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "enginebuilds"
        )["items"]
        return items

    def jobs(self) -> list[Any]:
        return list(self.batch.list_namespaced_job(self.namespace).items)

    def pods(self, selector: str) -> list[Any]:
        return list(self.core.list_namespaced_pod(self.namespace, label_selector=selector).items)

    def patch(self, name: str, spec: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "speculativedeployments", name, {"spec": spec}
        )


@pytest.fixture
def cluster(kubectl: Kubectl, api_client: client.ApiClient) -> Iterator[Cluster]:
    """A fresh namespace the session's operator watches."""
    with fresh_namespace(client.CoreV1Api(api_client), OPERATOR_NAMESPACE_PREFIX) as namespace:
        yield Cluster(kubectl, api_client, namespace)


def condition(status: dict[str, Any], type_: str) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == type_)


def assert_phase_order(seen: list[str]) -> None:
    order = [PHASE_ORDER.index(p) for p in seen if p in PHASE_ORDER]
    assert order == sorted(order), f"phases went backwards: {seen}"


# -- every example --------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", GPU_EXAMPLES, ids=[example_id(p) for p in GPU_EXAMPLES])
def test_example_goes_from_building_to_ready_with_its_jobs_gpus_and_endpoint(
    cluster: Cluster, path: Path
) -> None:
    doc = load(path)
    name = cluster.apply(doc)
    status = cluster.wait_phase(name, "Ready", timeout=120)
    assert_phase_order(cluster.phases[name])

    sdep = SpeculativeDeployment.model_validate(cluster.sdep(name))
    settings = OperatorSettings()
    wanted = build_engine_builds(sdep, settings)
    assert {e["metadata"]["name"] for e in cluster.engine_builds()} == {e["metadata"]["name"] for e in wanted}
    if wanted:
        assert "Building" in cluster.phases[name] or "Pending" in cluster.phases[name]
    jobs = {job.metadata.name: job for job in cluster.jobs()}
    for engine in wanted:
        observed = next(
            e for e in cluster.engine_builds() if e["metadata"]["name"] == engine["metadata"]["name"]
        )
        assert observed["status"]["phase"] == "Succeeded"
        assert status["engines"][engine["spec"]["role"]]["name"] == engine["metadata"]["name"]
        # The Job runs exactly the commands and GPU requests the builders render (held against the seeds
        # in tests/unit/test_builders_seed.py), on the serving GPU product.
        job = jobs[job_name(engine)]
        expected = build_job(
            {**engine, "metadata": {**engine["metadata"], "uid": observed["metadata"]["uid"]}}
        )
        template = job.spec.template.spec
        assert [c.command for c in template.init_containers] == [
            c["command"] for c in expected["spec"]["template"]["spec"]["initContainers"]
        ]
        assert template.node_selector == expected["spec"]["template"]["spec"].get("nodeSelector")
        if engine["spec"].get("stageOnly"):
            # A staged checkpoint (backend transformers): a download, no GPU anywhere.
            assert template.node_selector is None
            assert not template.tolerations
            assert all(not (c.resources and c.resources.requests) for c in template.init_containers)
        else:
            gpu_step = template.init_containers[-1]
            tp_pp = engine["spec"]["parallelism"]
            gpus = tp_pp.get("tensorParallel", 1) * tp_pp.get("pipelineParallel", 1)
            assert gpu_step.resources.requests["nvidia.com/gpu"] == str(gpus)
        assert job.metadata.owner_references[0].kind == "EngineBuild"

    product = sdep.spec.placement.gpu_product or settings.default_gpu_product
    pods = cluster.pods(status["selector"])
    assert len(pods) == sdep.spec.replicas
    for pod in pods:
        requests = pod.spec.containers[0].resources.requests or {}
        if sdep.spec.placement.device == "cpu":
            assert "nvidia.com/gpu" not in requests
            assert not pod.spec.tolerations or all(t.key != "nvidia.com/gpu" for t in pod.spec.tolerations)
            continue
        node = cluster.core.read_node(pod.spec.node_name)
        assert node.metadata.labels["nvidia.com/gpu.product"] == product
        assert requests["nvidia.com/gpu"] == str(sdep.spec.gpus_per_pod)
    assert status["endpoint"] == f"http://{name}.{cluster.namespace}.svc:{sdep.spec.serving.port}/v1"
    assert status["modelName"] == sdep.spec.served_model_names[0]
    assert status["readyReplicas"] == status["replicas"] == status["updatedReplicas"] == sdep.spec.replicas
    assert status["readyText"] == f"{sdep.spec.replicas}/{sdep.spec.replicas}"
    assert status["gpusPerReplica"] == sdep.spec.gpus_per_replica
    assert condition(status, "Available")["status"] == "True"
    assert condition(status, "EnginesReady")["status"] == "True"
    assert condition(status, "Progressing")["reason"] == "RolloutComplete"
    # A replica that spans nodes is a LeaderWorkerSet group (tests/integration/test_multinode.py).
    workload = "deployment" if sdep.spec.nodes_per_replica == 1 else "leaderworkerset"
    for kind in ("configmap", "service", "poddisruptionbudget", workload):
        out = cluster.kubectl(
            "get",
            kind,
            "-n",
            cluster.namespace,
            "-l",
            status["selector"],
            "-o",
            "json",
            "--show-managed-fields",
        )
        items = json.loads(out.stdout)["items"]
        assert items, f"no {kind} of {name}"
        for item in items:
            owner = item["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"], owner["controller"]) == (
                "SpeculativeDeployment",
                name,
                True,
            )
            managers = {m["manager"] for m in item["metadata"]["managedFields"] if m["operation"] == "Apply"}
            assert managers == {"specdeploy"}
    # The operator posts its events after the status write that said Ready.
    posted = {"RolloutStarted", "RolloutFinished"}
    if wanted:
        posted |= {"BuildStarted", "BuildSucceeded"}

    def operator_reasons() -> set[str]:
        events = cluster.core.list_namespaced_event(cluster.namespace).items
        return {e.reason for e in events if e.source and e.source.component == "specdeploy-operator"}

    wait_for(lambda: posted <= operator_reasons(), timeout=30, what=f"the events {sorted(posted)}")


# -- engines: sharing, no rebuild, rebuild ---------------------------------------------------------------


def test_two_deployments_that_need_the_same_target_engine_share_one_build(cluster: Cluster) -> None:
    first = example("02")
    second = copy.deepcopy(first)
    second["metadata"]["name"] = "second"
    second["spec"]["draft"]["model"]["uri"] = "hf://meta-llama/Llama-3.2-3B-Instruct"  # another draft
    a, b = cluster.apply(first), cluster.apply(second)
    status_a = cluster.wait_phase(a, "Ready")
    status_b = cluster.wait_phase(b, "Ready")
    assert status_a["engines"]["target"]["name"] == status_b["engines"]["target"]["name"]
    assert status_a["engines"]["draft"]["name"] != status_b["engines"]["draft"]["name"]
    roles = sorted(e["spec"]["role"] for e in cluster.engine_builds())
    assert roles == ["draft", "draft", "target"]
    job_roles = sorted(j.metadata.labels["specdeploy.dev/engine-role"] for j in cluster.jobs())
    assert job_roles == ["draft", "draft", "target"], "one build of the shared target"


def test_changing_replicas_or_runtime_does_not_rebuild(cluster: Cluster) -> None:
    name = cluster.apply(example("02"))
    status = cluster.wait_phase(name, "Ready")
    seen = len(cluster.phases[name])
    engines_before = {e["metadata"]["name"] for e in cluster.engine_builds()}
    jobs_before = {j.metadata.name for j in cluster.jobs()}

    cluster.patch(name, {"replicas": 2, "runtime": {"kvCacheFreeGpuMemFraction": 0.5, "maxBatchSize": 16}})
    status = cluster.wait_phase(name, "Ready")
    assert status["readyReplicas"] == 2
    assert {e["metadata"]["name"] for e in cluster.engine_builds()} == engines_before
    assert {j.metadata.name for j in cluster.jobs()} == jobs_before
    assert "Building" not in cluster.phases[name][seen:]


@pytest.mark.parametrize(
    "change",
    [
        # The example's FP8 GEMM plugins need FP8 weights: a user switching to INT8 SmoothQuant drops them.
        {
            "target": {
                "quantization": {"format": "int8_sq"},
                "build": {"gemmPlugin": "auto", "gemmSwigluPlugin": None, "useFp8ContextFmha": None},
            }
        },
        {"speculative": {"maxDraftLen": 8}},
    ],
    ids=["quantization-format", "max-draft-len"],
)
def test_changing_the_engine_builds_a_new_one_and_rolls_the_pods(
    cluster: Cluster, change: dict[str, Any]
) -> None:
    doc = example("tensorrt-02")
    name = cluster.apply(doc)
    before = cluster.wait_phase(name, "Ready")
    old_pods = {p.metadata.name for p in cluster.pods(before["selector"])}
    old_target = before["engines"]["target"]["name"]

    cluster.patch(name, change)
    after = cluster.wait_phase(name, "Ready", timeout=120)
    assert after["engines"]["target"]["name"] != old_target
    assert old_target in after["engines"].get("previous", []), "the previous engine is kept for rollback"
    assert "Building" in cluster.phases[name]
    new_pods = {p.metadata.name for p in cluster.pods(after["selector"]) if not p.metadata.deletion_timestamp}
    assert new_pods
    assert not (new_pods & old_pods), "pods rolled over to the new engine"
    hashes = {e["spec"]["hash"] for e in cluster.engine_builds() if e["spec"]["role"] == "target"}
    template = cluster.apps.read_namespaced_deployment(name, cluster.namespace).spec.template
    assert (
        f"target={after['engines']['target']['hash']}"
        in template.metadata.annotations["specdeploy.dev/engine-hashes"]
    )
    assert len(hashes) == 2


def test_pytorch_backend_with_quantization_builds_a_checkpoint_once_and_serves_it(cluster: Cluster) -> None:
    doc = example("06")
    doc["spec"]["target"]["quantization"] = {"format": "fp8"}
    name = cluster.apply(doc)
    status = cluster.wait_phase(name, "Ready", timeout=120)
    (engine,) = cluster.engine_builds()
    assert engine["spec"]["role"] == "target"
    assert engine["spec"]["buildFlags"] == []
    assert status["engines"]["target"]["name"] == engine["metadata"]["name"]
    (job,) = cluster.jobs()
    steps = [c.name for c in job.spec.template.spec.init_containers]
    assert steps == ["quantize"], "a quantized checkpoint, no trtllm-build"
    pod = cluster.pods(status["selector"])[0]
    mounts = {m.name: m.mount_path for m in pod.spec.containers[0].volume_mounts}
    assert mounts["engine-cache"] == OperatorSettings().cache_mount_path


# -- failures ------------------------------------------------------------------------------------------


def test_failed_build_reports_the_pod_message_and_a_fixed_spec_recovers(cluster: Cluster) -> None:
    doc = example("02")
    doc["spec"]["images"] = {"builder": FAILING_IMAGE}
    name = cluster.apply(doc)
    status = cluster.wait_phase(name, "Failed", timeout=120)
    engines = condition(status, "EnginesReady")
    assert engines["reason"] == "BuildFailed"
    assert f"simulated failure of image {FAILING_IMAGE}" in engines["message"]
    failed = [e for e in cluster.engine_builds() if e["status"]["phase"] == "Failed"]
    assert failed
    assert all(e["status"]["attempts"] == 2 for e in failed), "one retry (backoffLimit 1)"
    assert "BackoffLimitExceeded" in failed[0]["status"]["message"]

    cluster.patch(name, {"images": {"builder": None}})
    status = cluster.wait_phase(name, "Ready", timeout=120)
    assert condition(status, "EnginesReady")["status"] == "True"


def test_a_replica_no_node_can_hold_reports_capacity_pending_with_the_scheduler_message(
    cluster: Cluster,
) -> None:
    # 8 target GPUs plus a dedicated draft GPU: 9 on one node, more than any node (or node pool) of the
    # simulated cluster has, so not even the Cluster Autoscaler can help. (The spec claims 16-GPU nodes, or
    # admission would refuse it.)
    doc = example("tensorrt-04b")
    doc["spec"]["target"]["tensorParallel"] = 8
    doc["spec"]["placement"]["draft"] = "dedicated"
    doc["spec"]["placement"]["gpusPerNode"] = 16
    name = cluster.apply(doc)

    def pending() -> dict[str, Any] | None:
        status = cluster.status(name)
        degraded = next((c for c in status.get("conditions") or () if c["type"] == "Degraded"), None)
        stuck = degraded is not None and degraded["reason"] == "CapacityPending"
        return status if stuck else None

    status = wait_for(pending, timeout=120, what="the replica CapacityPending")
    assert status["phase"] == "Degraded"
    assert status["gpusPerReplica"] == 9
    assert status["capacityPendingReplicas"] == 1
    assert "Insufficient nvidia.com/gpu" in condition(status, "Degraded")["message"]
    assert status["readyReplicas"] == 0

    cluster.patch(name, {"placement": {"draft": "colocated"}})
    status = cluster.wait_phase(name, "Ready")
    assert "capacityPendingReplicas" not in status


# -- scale, delete ---------------------------------------------------------------------------------------


def test_kubectl_scale_reaches_the_deployment(cluster: Cluster) -> None:
    name = cluster.apply(example("02"))
    cluster.wait_phase(name, "Ready")
    cluster.kubectl("scale", f"sdep/{name}", "-n", cluster.namespace, "--replicas=3")
    status = cluster.wait_phase(name, "Ready")
    assert status["replicas"] == status["readyReplicas"] == 3
    assert cluster.apps.read_namespaced_deployment(name, cluster.namespace).spec.replicas == 3
    scale = cluster.kubectl(
        "get",
        "--raw",
        f"/apis/{GROUP}/{VERSION}/namespaces/{cluster.namespace}/speculativedeployments/{name}/scale",
    ).stdout
    assert json.loads(scale)["status"]["replicas"] == 3


def test_deleting_a_deployment_removes_its_children_and_unused_engines(cluster: Cluster) -> None:
    name = cluster.apply(example("02"))
    status = cluster.wait_phase(name, "Ready")
    assert cluster.engine_builds()
    cluster.kubectl("delete", f"sdep/{name}", "-n", cluster.namespace, "--wait=true", "--timeout=30s")

    def gone() -> bool:
        ns = cluster.namespace
        leftovers = (
            cluster.apps.list_namespaced_deployment(ns).items
            + cluster.core.list_namespaced_service(ns).items
            + [
                c
                for c in cluster.core.list_namespaced_config_map(ns).items
                if c.metadata.name != "kube-root-ca.crt"
            ]
            + cluster.pods(status["selector"])
            + cluster.engine_builds()
            + cluster.jobs()
        )
        return not leftovers

    wait_for(gone, timeout=60, what="children and engines garbage-collected")


def test_steady_state_makes_no_requests(
    cluster: Cluster, operator: OperatorProcess, local_cluster: LocalCluster | None
) -> None:
    """Once Ready, nothing changes, so the operator writes nothing about this deployment (its own requests
    are read from the API server's audit log; on an existing cluster, from the operator's metrics)."""
    name = cluster.apply(example("01"))
    cluster.wait_phase(name, "Ready")

    def requests() -> float:
        if local_cluster is not None:
            return float(len(audit_entries(local_cluster, cluster.namespace)))
        return sum(
            v for k, v in operator.metrics().items() if k.startswith("specdeploy_operator_api_requests_total")
        )

    # The rollout's last watch events and writes: over once the count stops moving (the audit backend
    # writes in batches of at most 1 s, well within the quiet windows).
    before = wait_quiet(requests, what="the operator's requests after Ready")
    # Then nothing at all over three more rounds of status.speculation (every 3 s here).
    assert wait_quiet(requests, quiet=10, what="the operator's requests, Ready and unchanged") == before


def audit_entries(local_cluster: LocalCluster, namespace: str) -> list[dict[str, Any]]:
    """The operator's requests about objects in `namespace` (watches are cluster-wide and not included)."""
    entries = []
    for line in local_cluster.audit_log.read_text().splitlines():
        entry = json.loads(line)
        if (entry.get("objectRef") or {}).get("namespace") == namespace:
            entries.append(entry)
    return entries
