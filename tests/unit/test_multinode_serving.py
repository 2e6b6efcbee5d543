"""Replicas that span nodes: what the operator renders for them (a LeaderWorkerSet, its Service, budget and
configuration), the switch between one node and several, and the status a group's pods give."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from specdeploy_operator.api import EnvVar, SpeculativeDeployment, parse_object
from specdeploy_operator.builders import (
    OperatorSettings,
    build_job,
    engine_builds,
    group_set_name,
    serving_children,
)
from specdeploy_operator.controller.deploymentplan import leaders_current, may_retire, template_changed
from specdeploy_operator.controller.podcreation import (
    events_creation_problem,
    group_events_wait,
    group_sets_to_ask,
)
from specdeploy_operator.controller.status import EngineObservation, ServingObservation, deployment_status

ROOT = Path(__file__).resolve().parents[2]
NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


def _sdep(replicas: int = 1, **placement: Any) -> SpeculativeDeployment:
    body = yaml.safe_load((ROOT / "examples/11-mtp-deepseek-r1-2x8xh100.yaml").read_text())
    body["spec"]["replicas"] = replicas
    body["spec"]["placement"].update(placement)
    body["metadata"]["namespace"] = "models"
    sdep = parse_object(body)
    assert isinstance(sdep, SpeculativeDeployment)
    return sdep


def _children(sdep: SpeculativeDeployment) -> Any:
    return serving_children(sdep, [], OperatorSettings())


def test_a_replica_of_sixteen_gpus_on_eight_gpu_nodes_is_a_group_of_two_pods_of_eight() -> None:
    sdep = _sdep(replicas=3)
    assert (sdep.spec.nodes_per_replica, sdep.spec.gpus_per_pod) == (2, 8)
    lws = _children(sdep).workload
    assert lws["kind"] == "LeaderWorkerSet"
    assert lws["metadata"]["name"] == group_set_name(sdep) == "deepseek-r1-mtp-lws"
    spec = lws["spec"]
    assert spec["replicas"] == 3
    template = spec["leaderWorkerTemplate"]
    assert template["size"] == 2
    assert template["restartPolicy"] == "RecreateGroupOnPodRestart"
    for role, component in (("leaderTemplate", "server"), ("workerTemplate", "worker")):
        pod = template[role]
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == component
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["requests"]["nvidia.com/gpu"] == "8"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        assert container["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    assert leader["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert spec["rolloutStrategy"]["rollingUpdateConfiguration"] == {"maxSurge": 0, "maxUnavailable": 1}


def test_the_serving_env_is_every_ranks_after_nccls() -> None:
    base = _sdep()
    serving = base.spec.serving.model_copy(update={"env": [EnvVar(name="TLLM_LOG_LEVEL", value="INFO")]})
    sdep = base.model_copy(update={"spec": base.spec.model_copy(update={"serving": serving})})
    template = _children(sdep).workload["spec"]["leaderWorkerTemplate"]
    for role in ("leaderTemplate", "workerTemplate"):
        (container,) = template[role]["spec"]["containers"]
        assert [e["name"] for e in container["env"]] == ["NCCL_SOCKET_IFNAME", "TLLM_LOG_LEVEL"]


def test_the_service_reaches_the_leaders_only_and_the_budget_takes_one_pod_at_a_time() -> None:
    children = _children(_sdep(replicas=2))
    assert children.service["spec"]["selector"]["app.kubernetes.io/component"] == "server"
    budget = children.pdb["spec"]
    assert budget["maxUnavailable"] == 1
    assert "app.kubernetes.io/component" not in budget["selector"]["matchLabels"]
    single = _children(_sdep(replicas=1)).pdb["spec"]
    assert single["minAvailable"] == 0


def test_the_launch_scripts_are_part_of_the_configuration_that_rolls_the_groups() -> None:
    children = _children(_sdep())
    assert {"launch-leader.sh", "launch-worker.sh"} <= set(children.configmap["data"])
    other = _children(_sdep(multiNode={"nccl": {"infiniband": False}}))
    assert template_changed(children.workload, other.workload)


def test_exclusive_topology_is_the_leaderworkerset_annotation() -> None:
    lws = _children(_sdep(multiNode={"exclusiveTopology": "example.com/nvlink-domain"})).workload
    annotation = lws["metadata"]["annotations"]["leaderworkerset.sigs.k8s.io/exclusive-topology"]
    assert annotation == "example.com/nvlink-domain"
    assert "annotations" not in _children(_sdep()).workload["metadata"]


def test_one_node_per_replica_is_still_a_deployment() -> None:
    assert _children(_sdep(gpusPerNode=16)).workload["kind"] == "Deployment"


def test_the_old_workload_goes_only_once_the_new_one_serves_every_replica() -> None:
    def workload(ready: int) -> dict[str, Any]:
        return {"spec": {"replicas": 2}, "status": {"readyReplicas": ready}}

    assert not may_retire(workload(1), current=True)
    assert not may_retire(workload(2), current=False)
    assert may_retire(workload(2), current=True)


def _group_pod(group: int, worker: int, pending: bool) -> dict[str, Any]:
    conditions = []
    if pending:
        message = "0/4 nodes are available: 4 Insufficient nvidia.com/gpu."
        conditions.append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}
        )
    name = f"deepseek-r1-mtp-lws-{group}" + (f"-{worker}" if worker else "")
    labels = {"leaderworkerset.sigs.k8s.io/group-index": str(group)}
    meta = {"name": name, "labels": labels, "creationTimestamp": f"2026-11-27T11:00:0{group}Z"}
    return {
        "metadata": meta,
        "status": {"phase": "Pending" if pending else "Running", "conditions": conditions},
    }


def test_a_group_waiting_for_gpus_counts_once_and_is_named() -> None:
    lws = {
        "kind": "LeaderWorkerSet",
        "metadata": {"generation": 4},
        "spec": {"replicas": 2},
        "status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2},
    }
    pods = [_group_pod(0, 0, False), _group_pod(0, 1, False), _group_pod(1, 0, True), _group_pod(1, 1, True)]
    status = deployment_status(
        generation=4,
        desired_replicas=2,
        engines=[EngineObservation("target", "e", "0" * 16, {"status": {"phase": "Succeeded"}})],
        serving=ServingObservation(lws, True, pods),
        selector="a=b",
        endpoint="http://x.models.svc:8000/v1",
        gpus_per_replica=16,
        nodes_per_replica=2,
        previous=None,
        keep_previous=1,
        now=NOW,
    )
    assert status["capacityPendingReplicas"] == 1
    assert status["nodesPerReplica"] == 2
    assert status["readyText"] == "1/2"
    progressing = next(c for c in status["conditions"] if c["type"] == "Progressing")
    assert progressing["reason"] == "CapacityPending"
    assert "1 of 2 replicas (group 1) wait for capacity" in progressing["message"]
    assert "16 nvidia.com/gpu each, on 2 nodes of 8" in progressing["message"]


def test_a_target_that_spans_nodes_is_quantized_on_one_nodes_gpus() -> None:
    body = yaml.safe_load((ROOT / "examples/11-mtp-deepseek-r1-2x8xh100.yaml").read_text())
    body["spec"]["target"]["quantization"] = {"format": "fp8"}
    sdep = parse_object(body)
    assert isinstance(sdep, SpeculativeDeployment)
    (engine,) = engine_builds(sdep, OperatorSettings())
    assert engine.spec.build_gpus == 8
    assert engine.spec.parallelism.tensor_parallel == 16
    assert engine.spec.hash == engine.spec.model_copy(update={"build_gpus": None}).content_hash()
    pod = build_job(engine)["spec"]["template"]["spec"]
    quantize = next(c for c in pod["initContainers"] if c["name"] == "quantize")
    assert quantize["resources"]["requests"]["nvidia.com/gpu"] == "8"


def _member(group: int, worker: int) -> dict[str, Any]:
    labels = {
        "leaderworkerset.sigs.k8s.io/group-index": str(group),
        "leaderworkerset.sigs.k8s.io/worker-index": str(worker),
    }
    return {"metadata": {"name": f"g{group}-{worker}", "labels": labels}, "status": {"phase": "Running"}}


def test_the_statefulsets_of_groups_missing_pods_are_asked_why() -> None:
    lws = {
        "kind": "LeaderWorkerSet",
        "metadata": {"name": "d-lws"},
        "spec": {"replicas": 2, "leaderWorkerTemplate": {"size": 2}},
    }
    whole = [_member(0, 0), _member(0, 1), _member(1, 0), _member(1, 1)]
    assert group_sets_to_ask(lws, whole) == []
    assert group_sets_to_ask(lws, whole[:3]) == ["d-lws-1"]  # group 1's worker is missing
    assert group_sets_to_ask(lws, whole[:2]) == ["d-lws"]  # group 1's leader is missing
    assert group_sets_to_ask({"kind": "Deployment", "metadata": {"name": "d"}}, []) == []


def test_a_refused_group_pod_is_the_newest_failed_create_event() -> None:
    refused = {
        "reason": "FailedCreate",
        "lastTimestamp": "2026-11-27T11:00:02Z",
        "message": 'create Pod d-lws-1 in StatefulSet d-lws failed error: pods "d-lws-1" is forbidden: '
        "exceeded quota: gpus, requested: requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=16, "
        "limited: requests.nvidia.com/gpu=16",
    }
    created = {"reason": "SuccessfulCreate", "lastTimestamp": "2026-11-27T11:00:01Z", "message": "ok"}
    problem = events_creation_problem([created, refused])
    assert problem is not None
    assert problem.reason == "QuotaExceeded"
    later = {**created, "lastTimestamp": "2026-11-27T11:00:03Z"}
    assert events_creation_problem([refused, later]) is None


def test_missing_group_pods_are_taken_for_pods_on_their_way_for_a_grace_period() -> None:
    lws = {"metadata": {"creationTimestamp": "2026-11-27T11:59:55Z"}}
    pod = {"metadata": {"creationTimestamp": "2026-11-27T11:59:58Z"}}
    assert group_events_wait(lws, [], NOW) == 5.0
    assert group_events_wait(lws, [pod], NOW) == 8.0  # the newest pod counts
    assert group_events_wait({"metadata": {"creationTimestamp": "2026-11-27T11:00:00Z"}}, [], NOW) == 0.0


def test_a_group_set_is_current_only_once_every_leader_runs_the_new_template() -> None:
    lws = _children(_sdep()).workload
    want = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["annotations"]

    def leader(annotations: dict[str, str], set_name: str = "deepseek-r1-mtp-lws") -> dict[str, Any]:
        labels = {"leaderworkerset.sigs.k8s.io/name": set_name, "app.kubernetes.io/component": "server"}
        return {"metadata": {"labels": labels, "annotations": annotations}}

    old = {**want, "specdeploy.dev/config-hash": "0" * 16}
    assert leaders_current(lws, [leader(want), leader(want)])
    assert not leaders_current(lws, [leader(want), leader(old)])
    assert leaders_current(lws, [leader(want), leader(old, set_name="other-lws")])  # another set's pods
    assert leaders_current(_children(_sdep(gpusPerNode=16)).workload, [leader(old)])  # a Deployment
