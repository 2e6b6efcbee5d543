"""Status says why pods cannot be created: a Deployment's ReplicaFailure, a Job's FailedCreate events, rolled
up into EngineBuild and SpeculativeDeployment conditions and a Warning event (controller/podcreation.py).

The messages are the API server's own, as the local cluster's 1.35 controllers report them."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from specdeploy_operator.api import Reason
from specdeploy_operator.controller.podcreation import (
    PodCreationProblem,
    classify,
    creation_event,
    deployment_creation_problem,
    job_creation_problem,
    job_events_needed,
)
from specdeploy_operator.controller.status import (
    EngineObservation,
    ServingObservation,
    deployment_status,
    engine_build_status,
)

NOW = datetime(2026, 11, 21, 12, 0, 0, tzinfo=UTC)
QUOTA = (
    'pods "llama-7c9d-x2" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=2, '
    "used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
)
PODSECURITY = (
    'pods "llama-7c9d-x2" is forbidden: violates PodSecurity "restricted:latest": allowPrivilegeEscalation '
    '!= false (container "server" must set securityContext.allowPrivilegeEscalation=false)'
)
LIMITRANGE = 'pods "llama-7c9d-x2" is forbidden: maximum memory usage per Container is 1Gi, but limit is 2Gi'


@pytest.mark.parametrize(
    ("message", "reason"),
    [
        (QUOTA, "QuotaExceeded"),
        ('pods "p" is forbidden: failed quota: q: must specify limits.cpu for: server', "QuotaExceeded"),
        (PODSECURITY, "PodCreationForbidden"),
        (LIMITRANGE, "PodCreationForbidden"),
        ("Internal error occurred: resource quota evaluation timed out", "PodCreationFailed"),
    ],
)
def test_refusals_are_classified_by_cause(message: str, reason: str) -> None:
    assert classify(message) == reason


def serving_deployment(*, failure: str | None, ready: int = 1) -> dict[str, Any]:
    conditions: list[dict[str, Any]] = [{"type": "Available", "status": "True"}]
    if failure is not None:
        conditions.append(
            {"type": "ReplicaFailure", "status": "True", "reason": "FailedCreate", "message": failure}
        )
    return {
        "metadata": {"generation": 4},
        "status": {
            "observedGeneration": 4,
            "replicas": 1,
            "readyReplicas": ready,
            "updatedReplicas": 1,
            "conditions": conditions,
        },
    }


def built_engine() -> EngineObservation:
    observed = {
        "status": {"phase": "Succeeded", "conditions": [{"type": "Succeeded", "reason": "BuildSucceeded"}]}
    }
    return EngineObservation("target", "m-target-0123456789abcdef", "0123456789abcdef", observed)


def status_for(
    engines: list[EngineObservation], serving: ServingObservation, previous: Any = None
) -> dict[str, Any]:
    return deployment_status(
        generation=4,
        desired_replicas=2,
        engines=engines,
        serving=serving,
        selector="a=b",
        endpoint="http://x.ns.svc:8000/v1",
        gpus_per_replica=2,
        previous=previous,
        keep_previous=1,
        now=NOW,
    )


def conditions(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in status["conditions"]}


def test_a_replica_failure_makes_the_deployment_degraded_with_the_api_servers_message() -> None:
    status = status_for([built_engine()], ServingObservation(serving_deployment(failure=QUOTA), True))
    assert status["phase"] == "Degraded"
    degraded = conditions(status)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "QuotaExceeded")
    assert "exceeded quota: gpus" in degraded["message"]
    assert degraded["message"].startswith("1 of 2 replicas ready; serving pods cannot be created")
    assert conditions(status)["Progressing"]["reason"] == "RolloutInProgress"


def test_the_condition_clears_once_the_deployment_drops_its_replica_failure() -> None:
    blocked = status_for([built_engine()], ServingObservation(serving_deployment(failure=PODSECURITY), True))
    assert conditions(blocked)["Degraded"]["reason"] == "PodCreationForbidden"
    cleared = status_for(
        [built_engine()], ServingObservation(serving_deployment(failure=None, ready=1), True), blocked
    )
    assert conditions(cleared)["Degraded"]["status"] == "False"
    assert cleared["phase"] == "Deploying"


def test_a_false_replica_failure_condition_is_no_problem() -> None:
    dep = serving_deployment(failure=None)
    dep["status"]["conditions"].append({"type": "ReplicaFailure", "status": "False", "message": QUOTA})
    assert deployment_creation_problem(dep) is None
    assert deployment_creation_problem(None) is None


# -- Jobs ---------------------------------------------------------------------------------------------------

JOB = {"metadata": {"name": "m-target-0123456789abcdef-build", "uid": "job-uid"}, "status": {}}


def event(reason: str, at: str, message: str = "", uid: str = "job-uid") -> dict[str, Any]:
    return {
        "reason": reason,
        "message": message,
        "lastTimestamp": at,
        "involvedObject": {"kind": "Job", "name": JOB["metadata"]["name"], "uid": uid},
    }


def test_a_jobs_newest_failed_create_event_is_the_problem() -> None:
    events = [
        event("FailedCreate", "2026-11-21T11:00:00Z", "old"),
        event("FailedCreate", "2026-11-21T11:00:09Z", f"Error creating: {QUOTA}"),
    ]
    problem = job_creation_problem(JOB, [], events)
    assert problem == PodCreationProblem(Reason.QUOTA_EXCEEDED, f"Error creating: {QUOTA}")


def test_a_pod_created_since_ends_the_problem() -> None:
    failed = event("FailedCreate", "2026-11-21T11:00:00Z", f"Error creating: {QUOTA}")
    created = event("SuccessfulCreate", "2026-11-21T11:00:30Z", "Created pod: x")
    same_second = event("SuccessfulCreate", "2026-11-21T11:00:00Z", "Created pod: x")
    assert job_creation_problem(JOB, [], [failed, created]) is None
    assert job_creation_problem(JOB, [], [failed, same_second]) is None


def test_events_of_an_earlier_job_of_the_same_name_are_ignored() -> None:
    stale = event("FailedCreate", "2026-11-21T11:00:00Z", QUOTA, uid="deleted-job")
    assert job_creation_problem(JOB, [], [stale]) is None


def test_events_are_read_only_for_a_running_job_without_a_live_pod() -> None:
    running_pod = {"metadata": {"name": "p"}, "status": {"phase": "Running"}}
    failed_pod = {"metadata": {"name": "p"}, "status": {"phase": "Failed"}}
    complete = {**JOB, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert job_events_needed(JOB, [])
    assert job_events_needed(JOB, [failed_pod])
    assert not job_events_needed(JOB, [running_pod])
    assert not job_events_needed({**JOB, "status": {"active": 1}}, [])
    assert not job_events_needed(complete, [])
    assert not job_events_needed(None, [])


def test_an_engine_build_whose_pod_is_refused_is_pending_with_the_reason() -> None:
    problem = PodCreationProblem(Reason.POD_CREATION_FORBIDDEN, f"Error creating: {PODSECURITY}")
    status = engine_build_status(JOB, [], None, NOW, problem)
    assert status["phase"] == "Pending"
    [succeeded] = status["conditions"]
    assert (succeeded["status"], succeeded["reason"]) == ("Unknown", "PodCreationForbidden")
    assert "violates PodSecurity" in status["message"]
    assert engine_build_status(JOB, [], None, NOW)["conditions"][0]["reason"] == "JobPending"


def test_a_refused_build_pod_shows_on_the_deployment_as_degraded_while_building() -> None:
    build = engine_build_status(JOB, [], None, NOW, PodCreationProblem(Reason.QUOTA_EXCEEDED, QUOTA))
    engine = EngineObservation("target", "m-target-0123456789abcdef", "0123456789abcdef", {"status": build})
    status = status_for([engine], ServingObservation(None, False))
    assert status["phase"] == "Building"
    assert conditions(status)["EnginesReady"]["reason"] == "QuotaExceeded"
    degraded = conditions(status)["Degraded"]
    assert (degraded["status"], degraded["reason"]) == ("True", "QuotaExceeded")
    assert "exceeded quota" in degraded["message"]


# -- events -------------------------------------------------------------------------------------------------


def test_a_warning_event_is_due_when_the_reason_first_appears_and_not_again() -> None:
    build = engine_build_status(JOB, [], None, NOW, PodCreationProblem(Reason.QUOTA_EXCEEDED, QUOTA))
    before = engine_build_status(JOB, [], None, NOW)
    reason, message = creation_event(before, build) or ("", "")
    assert reason == "QuotaExceeded"
    assert "exceeded quota" in message
    assert creation_event(build, build) is None
    assert creation_event(build, before) is None


def test_a_degraded_deployment_gets_its_event_from_the_phase_change_not_twice() -> None:
    status = status_for([built_engine()], ServingObservation(serving_deployment(failure=QUOTA), True))
    assert status["phase"] == "Degraded"
    assert creation_event({}, status) is None
