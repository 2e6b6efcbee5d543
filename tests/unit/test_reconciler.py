"""The reconciler itself, over a fake store (tests/unit/fake_cluster.py): it acts on live state, not on its
own bookkeeping. One test per finding of the review that asked for this (each failed on the reconciler
before it: hand edits kept, failed builds revived, refused applies never in status, O(N) user lookups)."""

from __future__ import annotations

import asyncio
import copy
import time
import types
from typing import Any

import pytest
from specdeploy_operator.api import SpeculativeDeployment
from specdeploy_operator.builders import OperatorSettings, build_engine_builds, job_name
from specdeploy_operator.controller import reconciler as reconciler_module
from specdeploy_operator.controller.deployments import ReconcileFailed, reconcile_deployment
from specdeploy_operator.controller.enginebuilds import reconcile_engine
from specdeploy_operator.controller.livestate import contains, difference
from specdeploy_operator.controller.queue import TokenBucket, WorkQueue
from specdeploy_operator.controller.reconciler import OWN_WRITE_TTL

from tests.unit.fake_cluster import FakeKube, bound_reconciler

NS = "team"


def cpu_deployment(name: str = "chat", replicas: int = 1) -> dict[str, Any]:
    """A deployment with no engine to build (a claim's checkpoint served on CPUs): serving objects at once."""
    return {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "backend": "transformers",
            "replicas": replicas,
            "target": {"model": {"uri": "pvc://models/target"}},
            "speculative": {"method": "promptLookup"},
            "placement": {"device": "cpu"},
        },
    }


def gpu_deployment(name: str = "gpu") -> dict[str, Any]:
    return {
        "apiVersion": "specdeploy.dev/v1alpha1",
        "kind": "SpeculativeDeployment",
        "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}", "generation": 1},
        "spec": {
            "backend": "tensorrt",
            "target": {"model": {"uri": "hf://org/target-8b"}},
            "speculative": {"method": "promptLookup"},
            "placement": {"gpuProduct": "NVIDIA-H100-80GB-HBM3"},
        },
    }


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def converge(kube: FakeKube, doc: dict[str, Any]) -> Any:
    kube.store[("SpeculativeDeployment", NS, doc["metadata"]["name"])] = copy.deepcopy(doc)
    reconciler = bound_reconciler(kube)

    async def twice() -> None:
        await reconcile_deployment(reconciler, NS, doc["metadata"]["name"])
        await reconcile_deployment(reconciler, NS, doc["metadata"]["name"])

    run(twice())
    return reconciler


def applies(kube: FakeKube) -> list[tuple[str, str]]:
    return [(kind, name) for verb, kind, name in kube.requests if verb == "apply"]


# -- drift ---------------------------------------------------------------------------------------------------


def test_the_steady_state_costs_no_request_although_the_server_added_defaults() -> None:
    kube = FakeKube()
    reconciler = converge(kube, cpu_deployment())
    kube.requests.clear()
    run(reconcile_deployment(reconciler, NS, "chat"))
    assert kube.requests == []


def test_own_writes_of_deleted_deployments_are_forgotten_at_the_resync(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What this process wrote is kept a while (the index lags behind its own writes); the periodic resync
    drops what is older than that, so deleted deployments leave nothing behind however many come and go."""
    kube = FakeKube()
    reconciler = bound_reconciler(kube)
    for i in range(20):
        doc = cpu_deployment(f"chat-{i}")
        kube.store[("SpeculativeDeployment", NS, f"chat-{i}")] = copy.deepcopy(doc)
        run(reconcile_deployment(reconciler, NS, f"chat-{i}"))
        for key in [key for key in kube.store if key[1] == NS]:
            del kube.store[key]
    assert len(reconciler._own_writes) >= 20 * 4
    later = time.monotonic() + OWN_WRITE_TTL + 1
    monkeypatch.setattr(reconciler_module, "time", types.SimpleNamespace(monotonic=lambda: later))

    async def resync() -> None:
        reconciler._resync_all()
        assert reconciler._resync is not None
        reconciler._resync.cancel()

    run(resync())
    assert reconciler._own_writes == {}


@pytest.mark.parametrize(
    ("kind", "name", "edit", "field"),
    [
        ("ConfigMap", "chat-server-config", {"data": {"server.yaml": "{}"}}, "data.server.yaml"),
        ("Deployment", "chat", {"spec": {"replicas": 5}}, "spec.replicas"),
        (
            "Service",
            "chat",
            {"spec": {"ports": [{"name": "http", "port": 9999, "targetPort": "http", "protocol": "TCP"}]}},
            "spec.ports[0].port",
        ),
        ("PodDisruptionBudget", "chat", {"spec": {"minAvailable": 7}}, "spec.minAvailable"),
        (
            "Deployment",
            "chat",
            {"metadata": {"labels": {"app.kubernetes.io/instance": "x"}}},
            "metadata.labels",
        ),
    ],
)
def test_a_field_another_actor_changed_is_applied_again(
    kind: str, name: str, edit: dict[str, Any], field: str
) -> None:
    kube = FakeKube()
    reconciler = converge(kube, cpu_deployment())
    kube.edit(kind, NS, name, edit)
    edited = copy.deepcopy(kube.store[(kind, NS, name)])
    kube.requests.clear()
    run(reconcile_deployment(reconciler, NS, "chat"))
    assert applies(kube) == [(kind, name)]
    assert (difference(edited, kube.store[(kind, NS, name)]) or "").startswith(field)
    kube.requests.clear()
    run(reconcile_deployment(reconciler, NS, "chat"))
    assert kube.requests == [], "repaired once, then quiet"


def test_fields_others_add_are_left_alone() -> None:
    kube = FakeKube()
    reconciler = converge(kube, cpu_deployment())
    kube.edit(
        "Deployment", NS, "chat", {"metadata": {"annotations": {"deployment.kubernetes.io/revision": "3"}}}
    )
    kube.edit(
        "Deployment",
        NS,
        "chat",
        {"spec": {"template": {"metadata": {"annotations": {"kubectl.kubernetes.io/restartedAt": "now"}}}}},
    )
    kube.requests.clear()
    run(reconcile_deployment(reconciler, NS, "chat"))
    assert applies(kube) == []


def test_containment_compares_quantities_by_value_and_ignores_defaults() -> None:
    desired: dict[str, Any] = {
        "kind": "Deployment",
        "metadata": {"name": "x", "labels": {"a": "b"}},
        "spec": {
            "template": {
                "spec": {"containers": [{"resources": {"limits": {"memory": "1024Mi", "cpu": "0.5"}}}]}
            }
        },
    }
    live = copy.deepcopy(desired)
    live["metadata"]["uid"] = "u"
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["resources"]["limits"] = {"memory": "1Gi", "cpu": "500m"}
    container["imagePullPolicy"] = "Always"
    assert contains(live, desired)
    container["resources"]["limits"]["cpu"] = "1"
    assert not contains(live, desired)
    assert difference(live, desired) == "spec.template.spec.containers[0].resources.limits.cpu"


# -- terminal phases -----------------------------------------------------------------------------------------


def failed_engine(kube: FakeKube) -> tuple[Any, str]:
    doc = gpu_deployment()
    kube.store[("SpeculativeDeployment", NS, "gpu")] = copy.deepcopy(doc)
    reconciler = bound_reconciler(kube)
    run(reconcile_deployment(reconciler, NS, "gpu"))
    (engine,) = build_engine_builds(SpeculativeDeployment.model_validate(doc), OperatorSettings())
    name = engine["metadata"]["name"]
    run(reconcile_engine(reconciler, NS, name))
    job = job_name(kube.store[("EngineBuild", NS, name)])
    assert ("Job", NS, job) in kube.store
    failed = {
        "type": "Failed",
        "status": "True",
        "reason": "BackoffLimitExceeded",
        "message": "out of retries",
    }
    kube.edit("Job", NS, job, {"status": {"failed": 3, "conditions": [failed]}})
    run(reconcile_engine(reconciler, NS, name))
    assert kube.store[("EngineBuild", NS, name)]["status"]["phase"] == "Failed"
    return reconciler, name


def test_a_failed_build_whose_job_is_deleted_stays_failed_and_creates_no_job() -> None:
    kube = FakeKube()
    reconciler, name = failed_engine(kube)
    job = kube.store[("EngineBuild", NS, name)]["status"]["jobName"]
    del kube.store[("Job", NS, job)]  # ttlSecondsAfterFinished, or a person
    kube.requests.clear()
    for _ in range(3):
        run(reconcile_engine(reconciler, NS, name))
    assert kube.store[("EngineBuild", NS, name)]["status"]["phase"] == "Failed"
    assert [k for k in kube.store if k[0] == "Job"] == []
    assert kube.requests == []


def test_a_retry_annotation_starts_a_new_attempt_with_a_job_of_its_own() -> None:
    kube = FakeKube()
    reconciler, name = failed_engine(kube)
    old_job = kube.store[("EngineBuild", NS, name)]["status"]["jobName"]
    kube.edit("EngineBuild", NS, name, {"metadata": {"annotations": {"specdeploy.dev/retry": "1"}}})
    run(reconcile_engine(reconciler, NS, name))
    status = kube.store[("EngineBuild", NS, name)]["status"]
    assert status["phase"] == "Pending"
    assert status["jobName"] != old_job
    assert ("Job", NS, old_job) not in kube.store, "the failed attempt's Job is deleted"
    assert ("Job", NS, status["jobName"]) in kube.store


def test_a_succeeded_build_is_not_looked_at_again_when_its_job_goes() -> None:
    kube = FakeKube()
    doc = gpu_deployment()
    kube.store[("SpeculativeDeployment", NS, "gpu")] = copy.deepcopy(doc)
    reconciler = bound_reconciler(kube)
    run(reconcile_deployment(reconciler, NS, "gpu"))
    name = next(k[2] for k in kube.store if k[0] == "EngineBuild")
    run(reconcile_engine(reconciler, NS, name))
    job = job_name(kube.store[("EngineBuild", NS, name)])
    done = {"type": "Complete", "status": "True"}
    kube.edit("Job", NS, job, {"status": {"succeeded": 1, "conditions": [done]}})
    run(reconcile_engine(reconciler, NS, name))
    assert kube.store[("EngineBuild", NS, name)]["status"]["phase"] == "Succeeded"
    del kube.store[("Job", NS, job)]
    kube.requests.clear()
    run(reconcile_engine(reconciler, NS, name))
    assert kube.requests == []


# -- errors reach status ---------------------------------------------------------------------------------


def test_an_apply_the_api_server_refuses_shows_in_the_synced_condition_and_is_retried() -> None:
    kube = FakeKube()
    kube.refuse[("Service", "chat")] = 'services "chat" is forbidden: exceeded quota: no-services'
    kube.store[("SpeculativeDeployment", NS, "chat")] = cpu_deployment()
    reconciler = bound_reconciler(kube)
    with pytest.raises(ReconcileFailed):
        run(reconcile_deployment(reconciler, NS, "chat"))
    status = kube.store[("SpeculativeDeployment", NS, "chat")]["status"]
    synced = next(c for c in status["conditions"] if c["type"] == "Synced")
    assert synced["status"] == "False"
    assert synced["reason"] == "ReconcileError"
    assert "exceeded quota: no-services" in synced["message"]
    assert any(reason == "ReconcileError" for _, reason, _ in kube.events)
    del kube.refuse[("Service", "chat")]
    run(reconcile_deployment(reconciler, NS, "chat"))
    status = kube.store[("SpeculativeDeployment", NS, "chat")]["status"]
    synced = next(c for c in status["conditions"] if c["type"] == "Synced")
    assert (synced["status"], synced["reason"]) == ("True", "ReconcileSuccess")


def test_a_refused_repair_of_another_child_leaves_a_ready_deployment_ready() -> None:
    """A hand-edited ConfigMap whose revert is refused: Synced says so, but the Deployment was not touched
    and is still current: the phase stays Ready, no rollout is reported, Progressing does not flip."""
    kube = FakeKube()
    reconciler = converge(kube, cpu_deployment())
    generation = kube.store[("Deployment", NS, "chat")]["metadata"]["generation"]
    rolled_out = {
        "observedGeneration": generation + 1,  # kube.edit bumps the generation
        "replicas": 1,
        "readyReplicas": 1,
        "updatedReplicas": 1,
        "conditions": [{"type": "Available", "status": "True"}],
    }
    kube.edit("Deployment", NS, "chat", {"status": rolled_out})
    run(reconcile_deployment(reconciler, NS, "chat"))
    before = copy.deepcopy(kube.store[("SpeculativeDeployment", NS, "chat")]["status"])
    assert before["phase"] == "Ready"
    kube.edit("ConfigMap", NS, "chat-server-config", {"data": {"server.yaml": "{}"}})
    kube.refuse[("ConfigMap", "chat-server-config")] = 'configmaps "chat-server-config" is forbidden'
    kube.events.clear()
    with pytest.raises(ReconcileFailed):
        run(reconcile_deployment(reconciler, NS, "chat"))
    after = kube.store[("SpeculativeDeployment", NS, "chat")]["status"]
    assert after["phase"] == "Ready"
    assert after.get("updatedReplicas") == before.get("updatedReplicas")
    conditions = {c["type"]: c for c in after["conditions"]}
    assert conditions["Synced"]["status"] == "False"
    for kind, condition in {c["type"]: c for c in before["conditions"]}.items():
        if kind != "Synced":
            assert conditions[kind] == condition, kind
    assert [reason for _, reason, _ in kube.events if reason in ("Deploying", "RolloutFinished")] == []


def test_retries_back_off_per_key_up_to_1000_s_and_share_a_10_per_second_bucket() -> None:
    queue: WorkQueue[str] = WorkQueue(lambda key: asyncio.sleep(0))
    delays = [queue.retry_delay(n) for n in range(1, 40)]
    assert delays[0] == pytest.approx(0.005)
    assert delays[1] == pytest.approx(0.010)
    assert max(delays) == 1000.0
    now = [0.0]
    bucket = TokenBucket(10.0, 100, clock=lambda: now[0])
    waits = [bucket.reserve() for _ in range(120)]
    assert waits[:100] == [0.0] * 100, "a burst of 100"
    assert waits[100] == pytest.approx(0.1)
    assert waits[119] == pytest.approx(2.0), "then 10 per second"


# -- lookups ---------------------------------------------------------------------------------------------


def test_the_users_of_an_engine_come_from_an_index_not_a_scan() -> None:
    kube = FakeKube()
    for name in ("a", "b"):
        kube.store[("SpeculativeDeployment", NS, name)] = gpu_deployment(name)
    reconciler = bound_reconciler(kube)
    (engine,) = build_engine_builds(
        SpeculativeDeployment.model_validate(gpu_deployment("a")), OperatorSettings()
    )
    assert reconciler.users_of(NS, engine["metadata"]["name"]) == ["a", "b"]
    reconciler.indices = {**reconciler.indices, "sdeps": None}  # no scan of the deployments happens
    assert reconciler.users_of(NS, engine["metadata"]["name"]) == ["a", "b"]
    assert reconciler.users_of(NS, "unknown") == []


def test_an_engine_a_deployment_stops_using_is_looked_at_again_at_once() -> None:
    """Its garbage collection then starts with the grace period, not at the next resync."""
    reconciler = bound_reconciler(FakeKube())
    doc = gpu_deployment("a")
    (old,) = build_engine_builds(SpeculativeDeployment.model_validate(doc), OperatorSettings())
    old_name = old["metadata"]["name"]
    reconciler.deployment_changed(NS, "a", {**doc, "status": {"engines": {"target": {"name": old_name}}}})
    assert ("engine", NS, old_name) not in reconciler.queue._queued
    doc["spec"]["speculative"]["maxDraftLen"] = 9  # a new engine; the status lists only it after the rollout
    (new,) = build_engine_builds(SpeculativeDeployment.model_validate(doc), OperatorSettings())
    reconciler.deployment_changed(
        NS, "a", {**doc, "status": {"engines": {"target": {"name": new["metadata"]["name"]}}}}
    )
    assert ("engine", NS, old_name) in reconciler.queue._queued
    assert ("engine", NS, new["metadata"]["name"]) not in reconciler.queue._queued


def test_reverting_a_hand_scaled_deployment_of_a_ready_deployment_writes_no_status_in_between() -> None:
    kube = FakeKube()
    reconciler = converge(kube, cpu_deployment())
    deployment = kube.store[("Deployment", NS, "chat")]
    generation = deployment["metadata"]["generation"]
    ready = {"type": "Available", "status": "True"}
    kube.edit(
        "Deployment",
        NS,
        "chat",
        {
            "status": {
                "observedGeneration": generation + 1,  # kube.edit bumps the generation
                "replicas": 1,
                "readyReplicas": 1,
                "updatedReplicas": 1,
                "conditions": [ready],
            }
        },
    )
    run(reconcile_deployment(reconciler, NS, "chat"))
    assert kube.store[("SpeculativeDeployment", NS, "chat")]["status"]["phase"] == "Ready"
    kube.edit("Deployment", NS, "chat", {"spec": {"replicas": 4}})  # a person scales it
    kube.requests.clear()
    run(reconcile_deployment(reconciler, NS, "chat"))
    assert applies(kube) == [("Deployment", "chat")], "reverted"
    assert [r for r in kube.requests if r[0] == "patch/status"] == [], (
        "the Deployment's controller has not observed the revert yet: the status keeps saying Ready"
    )
    observed = kube.store[("Deployment", NS, "chat")]["metadata"]["generation"] + 1
    kube.edit("Deployment", NS, "chat", {"status": {"observedGeneration": observed}})
    kube.requests.clear()
    run(reconcile_deployment(reconciler, NS, "chat"))
    assert kube.requests == [], "observed: still Ready, nothing to write"
