"""The controller's pure parts: status from observations, condition transitions, rollback engines and the
work queue."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime, timedelta
from typing import Any

from specdeploy_operator.api import ConditionStatus, ConditionType, Reason
from specdeploy_operator.controller.queue import WorkQueue
from specdeploy_operator.controller.reconciler import merge_patch
from specdeploy_operator.controller.status import (
    ConditionSpec,
    EngineObservation,
    ServingObservation,
    deployment_status,
    engine_build_status,
    hpa_report,
    merge_conditions,
    previous_engines,
)

from tests.conftest import wait_for_async

NOW = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC)


def job(conditions: list[dict[str, Any]] | None = None, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "m-target-0123456789abcdef-build"},
        "status": {**status, "conditions": conditions},
    }


def pod(
    phase: str, *, scheduled: str | None = None, exit_code: int | None = None, message: str = ""
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "conditions": []}
    if scheduled is not None:
        status["conditions"].append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": scheduled}
        )
    if exit_code is not None:
        status["containerStatuses"] = [
            {
                "name": "complete",
                "state": {"terminated": {"exitCode": exit_code, "reason": "Error", "message": message}},
            }
        ]
    return {
        "metadata": {"name": f"p-{phase.lower()}", "creationTimestamp": "2026-11-21T11:00:00Z"},
        "status": status,
    }


# -- EngineBuild status ---------------------------------------------------------------------------------


def test_engine_build_is_pending_until_its_job_exists_and_its_pod_runs() -> None:
    assert engine_build_status(None, [], None, NOW)["phase"] == "Pending"
    waiting = engine_build_status(job(active=1), [pod("Pending")], None, NOW)
    assert (waiting["phase"], waiting["attempts"]) == ("Pending", 1)
    running = engine_build_status(
        job(active=1, startTime="2026-11-21T11:59:00Z"), [pod("Running")], None, NOW
    )
    assert running["phase"] == "Running"
    assert running["startTime"] == "2026-11-21T11:59:00Z"


def test_engine_build_stays_running_while_its_finished_pod_waits_for_the_job_to_complete() -> None:
    previous = engine_build_status(job(active=1), [pod("Running")], None, NOW)
    finishing = engine_build_status(job(active=0), [pod("Succeeded")], previous, NOW)
    assert finishing["phase"] == "Running"


def test_engine_build_succeeds_with_its_completion_time() -> None:
    done = job([{"type": "Complete", "status": "True"}], succeeded=1, completionTime="2026-11-21T12:00:00Z")
    status = engine_build_status(done, [pod("Succeeded")], None, NOW)
    assert status["phase"] == "Succeeded"
    assert status["completionTime"] == "2026-11-21T12:00:00Z"
    assert status["conditions"][0]["status"] == "True"
    assert status["attempts"] == 1


def test_a_build_that_completes_before_its_job_counts_the_pod_still_had_one_attempt() -> None:
    early = job([{"type": "SuccessCriteriaMet", "status": "True"}], active=0, succeeded=0)
    assert engine_build_status(early, [pod("Succeeded")], None, NOW)["attempts"] == 1
    retried = job([{"type": "Complete", "status": "True"}], failed=1, succeeded=1)
    assert engine_build_status(retried, [pod("Succeeded")], None, NOW)["attempts"] == 2


def test_a_failed_build_counts_every_pod_it_ran_even_before_the_job_counts_the_last() -> None:
    failing = job([{"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"}], failed=1)
    pods = [pod("Failed", exit_code=1), pod("Failed", exit_code=1)]
    assert engine_build_status(failing, pods, None, NOW)["attempts"] == 2


def test_failed_build_carries_the_job_reason_and_the_pods_termination_message() -> None:
    failed = job(
        [
            {
                "type": "Failed",
                "status": "True",
                "reason": "BackoffLimitExceeded",
                "message": "Job has reached the specified backoff limit",
                "lastTransitionTime": "2026-11-21T11:58:00Z",
            }
        ],
        failed=2,
    )
    status = engine_build_status(
        failed, [pod("Failed", exit_code=3, message="CUDA out of memory")], None, NOW
    )
    assert status["phase"] == "Failed"
    assert status["attempts"] == 2
    assert "BackoffLimitExceeded" in status["message"]
    assert "complete: Error (exit 3): CUDA out of memory" in status["message"]
    assert status["completionTime"] == "2026-11-21T11:58:00Z"


def test_unschedulable_build_pod_says_why() -> None:
    status = engine_build_status(
        job(active=1),
        [pod("Pending", scheduled="0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")],
        None,
        NOW,
    )
    assert status["phase"] == "Pending"
    assert "Insufficient nvidia.com/gpu" in status["message"]
    assert status["conditions"][0]["reason"] == "Unschedulable"


# -- conditions ---------------------------------------------------------------------------------------------


def available(status: ConditionStatus, reason: Reason, message: str) -> list[ConditionSpec]:
    return [ConditionSpec(ConditionType.AVAILABLE, status, reason, message)]


def test_condition_keeps_its_transition_time_until_its_status_changes() -> None:
    first = merge_conditions(None, available(ConditionStatus.FALSE, Reason.NOT_DEPLOYED, "a"), NOW, 1)
    later = NOW + timedelta(minutes=5)
    unavailable = available(ConditionStatus.FALSE, Reason.MINIMUM_REPLICAS_UNAVAILABLE, "b")
    same = merge_conditions(first, unavailable, later, 2)
    assert same[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]
    assert same[0]["observedGeneration"] == 2
    flipped = merge_conditions(
        same, available(ConditionStatus.TRUE, Reason.MINIMUM_REPLICAS_AVAILABLE, "c"), later, 2
    )
    assert flipped[0]["lastTransitionTime"] == "2026-11-21T12:05:00Z"


# -- SpeculativeDeployment status --------------------------------------------------------------------------


def engine(phase: str, message: str = "", role: str = "target") -> EngineObservation:
    observed = {
        "status": {"phase": phase, "message": message, "conditions": [{"type": "Succeeded", "reason": "R"}]}
    }
    return EngineObservation(role, f"m-{role}-0123456789abcdef", "0123456789abcdef", observed)


def deployment(ready: int, replicas: int, updated: int, available: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"generation": 3},
        "status": {
            "observedGeneration": 3,
            "replicas": replicas,
            "readyReplicas": ready,
            "updatedReplicas": updated,
            "conditions": [{"type": "Available", "status": "True" if available else "False"}],
        },
    }


def status_of(
    engines: list[EngineObservation],
    serving: ServingObservation,
    previous: dict[str, Any] | None = None,
    gpus_per_replica: int = 2,
) -> dict[str, Any]:
    return deployment_status(
        generation=2,
        desired_replicas=2,
        engines=engines,
        serving=serving,
        selector="a=b",
        endpoint="http://x.ns.svc:8000/v1",
        gpus_per_replica=gpus_per_replica,
        previous=previous,
        keep_previous=1,
        now=NOW,
    )


def reasons(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_deployment_is_building_while_an_engine_builds() -> None:
    status = status_of(
        [engine("Running"), engine("Succeeded", role="draft")], ServingObservation(None, False)
    )
    assert status["phase"] == "Building"
    assert reasons(status)["EnginesReady"] == ("False", "Building")
    assert status["engines"]["draft"]["phase"] == "Succeeded"
    assert status["readyText"] == "0/2"


def test_deployment_is_ready_when_every_replica_is_updated_and_ready() -> None:
    status = status_of([engine("Succeeded")], ServingObservation(deployment(2, 2, 2), True))
    assert status["phase"] == "Ready"
    assert reasons(status) == {
        "EnginesReady": ("True", "EnginesBuilt"),
        "Available": ("True", "MinimumReplicasAvailable"),
        "Progressing": ("False", "RolloutComplete"),
        "Degraded": ("False", "AsExpected"),
        "Synced": ("True", "ReconcileSuccess"),
    }
    assert status["readyText"] == "2/2"


def test_rollout_in_progress_until_old_pods_are_gone() -> None:
    status = status_of([engine("Succeeded")], ServingObservation(deployment(2, 3, 1), True))
    assert status["phase"] == "Deploying"
    assert reasons(status)["Progressing"] == ("True", "RolloutInProgress")


def test_a_ready_deployment_stays_ready_while_surplus_pods_of_a_reverted_hand_edit_go_away() -> None:
    ready = status_of([engine("Succeeded")], ServingObservation(deployment(2, 2, 2), True))
    # Scaled by hand to 5 and reverted: the rendered pods all serve, three surplus ones are being removed.
    scaled = status_of([engine("Succeeded")], ServingObservation(deployment(5, 5, 5), True), previous=ready)
    # Template edited by hand and reverted: one surge pod of the edited template is being removed.
    edited = status_of([engine("Succeeded")], ServingObservation(deployment(2, 3, 2), True), previous=ready)
    for status in (scaled, edited):
        assert status["phase"] == "Ready"
        assert reasons(status)["Progressing"] == ("False", "RolloutComplete")
        assert "2 of 2 replicas ready" in next(
            c["message"] for c in status["conditions"] if c["type"] == "Progressing"
        )
    # A pod of the rendered template missing is not surplus: the deployment is short and says so.
    short = status_of([engine("Succeeded")], ServingObservation(deployment(1, 2, 1), True), previous=ready)
    assert short["phase"] == "Deploying"


def test_a_replica_short_of_gpus_is_capacity_pending_with_the_schedulers_message() -> None:
    pods = [
        pod("Running"),
        pod("Pending", scheduled="0/4 nodes are available: 1 Insufficient nvidia.com/gpu."),
    ]
    status = status_of(
        [engine("Succeeded")], ServingObservation(deployment(1, 2, 2, available=False), True, pods)
    )
    assert status["phase"] == "Degraded"
    assert reasons(status)["Degraded"] == ("True", "CapacityPending")
    assert reasons(status)["Progressing"] == ("True", "CapacityPending")
    assert reasons(status)["Available"] == ("False", "MinimumReplicasUnavailable")
    assert status["capacityPendingReplicas"] == 1
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert "Insufficient nvidia.com/gpu" in degraded["message"]
    assert degraded["message"].startswith("1 of 2 replicas wait for capacity (2 nvidia.com/gpu each)")

    nodes_arrived = status_of(
        [engine("Succeeded")],
        ServingObservation(deployment(2, 2, 2), True, [pod("Running"), pod("Running")]),
        previous=status,
    )
    assert nodes_arrived["phase"] == "Ready"
    assert "capacityPendingReplicas" not in nodes_arrived


def test_a_cpu_replica_short_of_cpu_is_capacity_pending_and_a_gpu_shortage_would_not_be() -> None:
    short = (
        "0/7 nodes are available: 1 Insufficient cpu, 6 node(s) didn't match Pod's node affinity/selector."
    )
    pods = [pod("Running"), pod("Pending", scheduled=short)]
    serving = ServingObservation(deployment(1, 2, 2, available=False), True, pods)
    status = status_of([], serving, gpus_per_replica=0)
    assert reasons(status)["Degraded"] == ("True", "CapacityPending")
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["message"].startswith("1 of 2 replicas wait for capacity (CPU and memory)")
    assert status["capacityPendingReplicas"] == 1
    # A GPU deployment short of CPU needs a person, not a GPU node.
    gpu = status_of([engine("Succeeded")], serving, gpus_per_replica=2)
    assert reasons(gpu)["Degraded"] == ("True", "Unschedulable")


def test_a_replica_that_no_node_admits_for_another_reason_is_unschedulable() -> None:
    pods = [
        pod("Running"),
        pod("Pending", scheduled="0/4 nodes are available: 4 node(s) had untolerated taint {a: b}."),
        pod("Pending", scheduled="0/4 nodes are available: 1 Insufficient nvidia.com/gpu."),
    ]
    status = status_of(
        [engine("Succeeded")], ServingObservation(deployment(1, 3, 3, available=False), True, pods)
    )
    assert reasons(status)["Degraded"] == ("True", "Unschedulable")
    assert "untolerated taint" in next(c for c in status["conditions"] if c["type"] == "Degraded")["message"]
    assert status["capacityPendingReplicas"] == 1


def test_the_autoscaler_report_repeats_what_the_hpa_says() -> None:
    hpa = {
        "status": {
            "desiredReplicas": 3,
            "conditions": [
                {"type": "AbleToScale", "status": "True", "reason": "ReadyForNewScale"},
                {
                    "type": "ScalingActive",
                    "status": "False",
                    "reason": "FailedGetPodsMetric",
                    "message": "unable to get metric specdeploy_queue_seconds",
                },
            ],
        }
    }
    assert hpa_report(hpa) == {
        "desiredReplicas": 3,
        "message": "FailedGetPodsMetric: unable to get metric specdeploy_queue_seconds",
    }
    assert hpa_report(None) == {}


def test_failed_build_fails_the_deployment_but_only_degrades_one_that_still_serves() -> None:
    failed = [engine("Failed", "BackoffLimitExceeded: ...; build: Error (exit 1): boom")]
    status = status_of(failed, ServingObservation(None, False))
    assert status["phase"] == "Failed"
    assert reasons(status)["EnginesReady"] == ("False", "BuildFailed")
    assert "boom" in next(c for c in status["conditions"] if c["type"] == "EnginesReady")["message"]
    serving = status_of(failed, ServingObservation(deployment(2, 2, 0), False))
    assert serving["phase"] == "Degraded"


def test_same_observations_give_the_same_status() -> None:
    serving = ServingObservation(deployment(2, 2, 2), True)
    first = status_of([engine("Succeeded")], serving)
    assert status_of([engine("Succeeded")], serving, previous=first) == first


def test_previous_engines_keep_one_per_role_and_drop_engines_in_use_again() -> None:
    old = {"target": {"name": "t1"}, "draft": {"name": "d1"}, "previous": ["t0", "d0"]}
    new = {"target": {"name": "t2"}, "draft": {"name": "d1"}}
    assert previous_engines(old, new, keep=1) == ["t1", "t0"]
    assert previous_engines(old, {"target": {"name": "t1"}}, keep=1) == ["d1"]
    assert previous_engines(old, new, keep=0) == []


# -- work queue --------------------------------------------------------------------------------------------


def test_queue_deduplicates_keys_and_never_runs_one_key_twice_at_once() -> None:
    async def scenario() -> tuple[list[str], int]:
        seen: list[str] = []
        active: set[str] = set()
        overlap = 0

        async def process(key: str) -> None:
            nonlocal overlap
            if key in active:
                overlap += 1
            active.add(key)
            seen.append(key)
            await asyncio.sleep(0.01)
            active.discard(key)

        queue: WorkQueue[str] = WorkQueue(process, workers=4)
        queue.start()
        for _ in range(5):
            queue.add("a")
        queue.add("b")
        await wait_for_async(lambda: "a" in active, what="a being processed")
        queue.add("a")  # while "a" is processed: once more afterwards
        await wait_for_async(
            lambda: len(seen) == 3 and not active, what="a processed again and nothing in progress"
        )
        await queue.stop()
        return seen, overlap

    seen, overlap = asyncio.run(scenario())
    assert sorted(seen) == ["a", "a", "b"]
    assert overlap == 0


def test_queue_retries_failures_with_growing_backoff_and_honours_requested_delays() -> None:
    async def scenario() -> list[float]:
        loop = asyncio.get_running_loop()
        times: list[float] = []

        async def process(key: str) -> float | None:
            times.append(loop.time())
            if len(times) < 3:
                raise RuntimeError("transient")
            return 0.05 if len(times) == 3 else None

        queue: WorkQueue[str] = WorkQueue(process, workers=1, base_backoff=0.02)
        queue.start()
        queue.add("k")
        deadline = loop.time() + 10
        while len(times) < 4 and loop.time() < deadline:
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # room for a fifth call, which must not come
        await queue.stop()
        return times

    times = asyncio.run(scenario())
    assert len(times) == 4
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert gaps[0] >= 0.019
    assert gaps[1] >= 0.039, "backoff doubles"
    assert gaps[2] >= 0.049, "a delay asked for by the reconciler"


def test_the_status_merge_patch_removes_fields_that_went_away_at_any_depth() -> None:
    old = {
        "phase": "Degraded",
        "capacityPendingReplicas": 1,
        "autoscaler": {"kind": "ScaledObject", "name": "a", "message": "KEDA missing"},
        "engines": {"target": {"name": "t"}, "draft": {"name": "d"}},
        "conditions": [{"type": "Degraded"}],
    }
    new = {
        "phase": "Ready",
        "autoscaler": {"kind": "ScaledObject", "name": "a"},
        "engines": {"target": {"name": "t"}},
        "conditions": [],
    }
    patch = merge_patch(old, new)
    assert patch == {
        "phase": "Ready",
        "capacityPendingReplicas": None,
        "autoscaler": {"kind": "ScaledObject", "name": "a", "message": None},
        "engines": {"target": {"name": "t"}, "draft": None},
        "conditions": [],
    }
