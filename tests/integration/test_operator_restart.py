"""Restart safety: the operator is SIGKILLed at different points of the pipeline and started again; the
state converges with exactly one Job per build, one Deployment, and the replicas asked for."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from specdeploy_localcluster.operatorproc import OperatorProcess

from tests.conftest import wait_for

from .test_operator import Cluster, cluster, example

__all__ = ["cluster"]  # the fixture, imported so pytest finds it here


def _kill_points(c: Cluster) -> list[tuple[str, Callable[[], bool]]]:
    """Moments to kill at, each a predicate that says the pipeline has reached it."""
    return [
        ("right after apply", lambda: True),
        ("once an EngineBuild exists", lambda: bool(c.engine_builds())),
        ("once a build Job exists", lambda: bool(c.jobs())),
        ("during the rollout", lambda: bool(c.apps.list_namespaced_deployment(c.namespace).items)),
    ]


def test_operator_killed_at_any_point_converges_without_duplicates(
    cluster: Cluster, operator: OperatorProcess
) -> None:
    base = example("tensorrt-01")  # the engine path: the max draft length is part of the engine
    job_uids: dict[str, str] = {}
    names: list[str] = []
    try:
        for i, (point, reached) in enumerate(_kill_points(cluster)):
            doc: dict[str, Any] = copy.deepcopy(base)
            doc["metadata"]["name"] = f"restart-{i}"
            # Distinct engines per deployment (max draft length is part of the engine), so each one builds.
            doc["spec"]["speculative"]["maxDraftLen"] = 4 + i
            doc["spec"]["replicas"] = 1
            names.append(cluster.apply(doc))
            wait_for(reached, timeout=60, interval=0.05, what=point)
            for job in cluster.jobs():
                job_uids.setdefault(job.metadata.name, job.metadata.uid)
            operator.kill()
            for job in cluster.jobs():
                job_uids.setdefault(job.metadata.name, job.metadata.uid)
            operator.start()
        for name in names:
            cluster.wait_phase(name, "Ready", timeout=120)
    finally:
        if not operator.running:
            operator.start()

    assert operator.starts >= 5
    engines = cluster.engine_builds()
    jobs = cluster.jobs()
    roles = sorted(e["spec"]["role"] for e in engines)
    # A target engine per deployment (the max draft length is built in); the draft engine is shared.
    assert roles == ["draft"] + ["target"] * len(names)
    assert sorted(j.metadata.labels["specdeploy.dev/engine-hash"] for j in jobs) == sorted(
        e["spec"]["hash"] for e in engines
    ), "exactly one Job per EngineBuild"
    for job in jobs:
        assert job_uids.get(job.metadata.name, job.metadata.uid) == job.metadata.uid, "a Job was re-created"
    # status.succeeded is the Job controller's, which may write it after the operator saw the build done.
    wait_for(
        lambda: all(job.status.succeeded == 1 for job in cluster.jobs()),
        timeout=60,
        what="every build Job's status.succeeded",
    )
    deployments = cluster.apps.list_namespaced_deployment(cluster.namespace).items
    assert sorted(d.metadata.name for d in deployments) == sorted(names)
    for name in names:
        status = cluster.status(name)
        pods = [p for p in cluster.pods(status["selector"]) if not p.metadata.deletion_timestamp]
        assert len(pods) == 1
        replica_sets = cluster.apps.list_namespaced_replica_set(
            cluster.namespace, label_selector=status["selector"]
        ).items
        assert len(replica_sets) == 1, "one rollout, no churn"
        assert status["readyReplicas"] == 1
