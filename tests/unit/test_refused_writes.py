"""Writes the API server refuses: an RBAC denial is reported as such (condition reason `Forbidden`, one
event, a hint at the Role), retried at most a minute apart; a create refused because the namespace is being
deleted ends the reconcile quietly; an EngineBuild status edited by hand yields to its build Job."""

from __future__ import annotations

import json
import time

import pytest
from specdeploy_operator.builders import job_name
from specdeploy_operator.controller.deployments import ReconcileFailed, reconcile_deployment
from specdeploy_operator.controller.enginebuilds import reconcile_engine
from specdeploy_operator.controller.kube import ApiError
from specdeploy_operator.controller.reconciler import RETRY_CEILING_SECONDS, TERMINATING_PAUSE_SECONDS

from tests.unit.fake_cluster import FakeKube, bound_reconciler
from tests.unit.test_reconciler import NS, cpu_deployment, gpu_deployment, run

RBAC_DENIAL = (
    'services "chat" is forbidden: User "system:serviceaccount:ops:specdeploy" cannot patch resource'
    ' "services" in API group "" in the namespace "team"'
)
TERMINATING = json.dumps(
    {
        "kind": "Status",
        "message": 'services "chat" is forbidden: unable to create new content in namespace team because it'
        " is being terminated",
        "reason": "Forbidden",
        "details": {
            "name": "chat",
            "kind": "services",
            "causes": [{"reason": "NamespaceTerminating", "message": "namespace team is being terminated"}],
        },
        "code": 403,
    }
)


def synced(kube: FakeKube, name: str = "chat") -> dict[str, str]:
    status = kube.store[("SpeculativeDeployment", NS, name)]["status"]
    return next(c for c in status["conditions"] if c["type"] == "Synced")


def test_an_rbac_denial_is_reported_as_forbidden_with_one_event_however_often_it_is_retried() -> None:
    kube = FakeKube()
    kube.refuse[("Service", "chat")] = RBAC_DENIAL
    kube.store[("SpeculativeDeployment", NS, "chat")] = cpu_deployment()
    reconciler = bound_reconciler(kube)
    for _ in range(3):  # a denied write fails the reconcile: the queue retries it
        with pytest.raises(ReconcileFailed, match='cannot patch resource "services"'):
            run(reconcile_deployment(reconciler, NS, "chat"))
    condition = synced(kube)
    assert (condition["status"], condition["reason"]) == ("False", "Forbidden")
    assert 'cannot patch resource "services"' in condition["message"]
    assert "Role or ClusterRole" in condition["message"]
    assert [reason for _, reason, _ in kube.events].count("Forbidden") == 1
    status_writes = [r for r in kube.requests if r[0] == "patch/status"]
    assert len(status_writes) == 1, "the same refusal is not written again"

    del kube.refuse[("Service", "chat")]  # the Role is fixed
    run(reconcile_deployment(reconciler, NS, "chat"))
    assert (synced(kube)["status"], synced(kube)["reason"]) == ("True", "ReconcileSuccess")


def test_a_quota_refusal_is_a_reconcile_error_not_an_rbac_denial() -> None:
    kube = FakeKube()
    kube.refuse[("Service", "chat")] = 'services "chat" is forbidden: exceeded quota: no-services'
    kube.store[("SpeculativeDeployment", NS, "chat")] = cpu_deployment()
    with pytest.raises(ReconcileFailed):
        run(reconcile_deployment(bound_reconciler(kube), NS, "chat"))
    assert synced(kube)["reason"] == "ReconcileError"
    assert "Role" not in synced(kube)["message"]


def test_a_create_refused_in_a_terminating_namespace_ends_the_reconcile_without_status_or_retry() -> None:
    kube = FakeKube()
    kube.refuse[("Service", "chat")] = TERMINATING
    kube.store[("SpeculativeDeployment", NS, "chat")] = cpu_deployment()
    assert run(reconcile_deployment(bound_reconciler(kube), NS, "chat")) is None
    assert "status" not in kube.store[("SpeculativeDeployment", NS, "chat")]
    assert kube.events == []


def test_reconciles_in_a_terminating_namespace_wait_instead_of_writing_each_vanishing_child_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    kube = FakeKube()
    kube.refuse[("Service", "chat")] = TERMINATING
    kube.store[("SpeculativeDeployment", NS, "chat")] = cpu_deployment()
    kube.store[("SpeculativeDeployment", NS, "other")] = cpu_deployment("other")
    reconciler = bound_reconciler(kube)
    assert run(reconciler._process(("sdep", NS, "chat"))) is None
    refused = len(kube.requests)
    clock[0] += 4.0
    # the namespace's next objects to vanish trigger reconciles: they wait, making no request
    assert run(reconciler._process(("sdep", NS, "other"))) == pytest.approx(TERMINATING_PAUSE_SECONDS - 4.0)
    assert run(reconciler._process(("sdep", NS, "chat"))) == pytest.approx(TERMINATING_PAUSE_SECONDS - 4.0)
    assert len(kube.requests) == refused
    # deferred, not dropped: once the pause is over (a namespace of that name made afresh) they run again
    del kube.refuse[("Service", "chat")]
    clock[0] += TERMINATING_PAUSE_SECONDS
    run(reconciler._process(("sdep", NS, "chat")))
    assert ("Service", NS, "chat") in kube.store


def test_refusal_kinds_are_told_apart_from_the_api_servers_status() -> None:
    denial = ApiError("PATCH", "/x", 403, json.dumps({"message": RBAC_DENIAL}))
    assert denial.rbac_denied
    assert not denial.namespace_terminating
    terminating = ApiError("PATCH", "/x", 403, TERMINATING)
    assert terminating.namespace_terminating
    assert not terminating.rbac_denied
    assert terminating.causes == {"NamespaceTerminating"}
    assert ApiError("PATCH", "/x", 403, "not json").causes == frozenset()
    conflict = ApiError("PATCH", "/x", 409, json.dumps({"message": 'cannot patch resource "x"'}))
    assert not conflict.rbac_denied


def test_a_failing_key_is_retried_at_least_once_a_minute() -> None:
    kube = FakeKube()
    reconciler = bound_reconciler(kube)
    delays = [reconciler.queue.retry_delay(n) for n in range(1, 40)]
    assert max(delays) == RETRY_CEILING_SECONDS == 60.0
    assert delays[:3] == [0.005, 0.01, 0.02], "still fast at first"


def test_an_engine_status_edited_by_hand_yields_to_its_build_job_while_the_job_is_there() -> None:
    kube = FakeKube()
    kube.store[("SpeculativeDeployment", NS, "gpu")] = gpu_deployment()
    reconciler = bound_reconciler(kube)
    run(reconcile_deployment(reconciler, NS, "gpu"))
    name = next(k[2] for k in kube.store if k[0] == "EngineBuild")
    run(reconcile_engine(reconciler, NS, name))
    job = job_name(kube.store[("EngineBuild", NS, name)])
    done = {"type": "Complete", "status": "True"}
    kube.edit("Job", NS, job, {"status": {"succeeded": 1, "conditions": [done]}})
    run(reconcile_engine(reconciler, NS, name))
    assert kube.store[("EngineBuild", NS, name)]["status"]["phase"] == "Succeeded"

    kube.edit("EngineBuild", NS, name, {"status": {"phase": "Failed", "message": "edited"}})
    run(reconcile_engine(reconciler, NS, name))
    assert kube.store[("EngineBuild", NS, name)]["status"]["phase"] == "Succeeded"
    kube.requests.clear()
    run(reconcile_engine(reconciler, NS, name))
    assert kube.requests == [], "the steady state still costs nothing"

    del kube.store[("Job", NS, job)]  # its TTL: the status is all that is left of the attempt
    kube.edit("EngineBuild", NS, name, {"status": {"phase": "Failed", "message": "edited"}})
    run(reconcile_engine(reconciler, NS, name))
    assert kube.store[("EngineBuild", NS, name)]["status"]["phase"] == "Failed"
