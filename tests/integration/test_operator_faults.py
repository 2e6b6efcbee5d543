"""The operator's fast reliability cases, on the session's cluster (the full set is the campaign,
`python -m benchmarks.operator_faults`, which shares these scenario functions): SIGKILL at write points and a
restart, kube-apiserver stopped mid-rollout while etcd's history is compacted (watches resume into 410 Gone),
etcd stopped mid-rollout, a standby replica taking over from a killed active one, a deployment deleted
mid-build, 63-character names, a write RBAC forbids, a namespace deleted under a deployment, and every owned
kind edited or deleted by hand. The scenarios' operators watch `chaos-*` namespaces, the session's operator
`op-*`, so exactly one operator acts on each deployment."""

from __future__ import annotations

import pytest
from specdeploy_localcluster.cluster import LocalCluster

from benchmarks.operator_faults.badstates import (
    deleted_mid_build,
    long_names,
    rbac_forbidden,
    terminating_namespace,
)
from benchmarks.operator_faults.campaign import FAST_KILL_POINTS, KILL_POINTS, Campaign, Outcome
from benchmarks.operator_faults.drift import drift
from benchmarks.operator_faults.faults import control_plane_restart, kill_at, takeover


@pytest.fixture
def campaign(local_cluster: LocalCluster | None, install_crds: list[str]) -> Campaign:
    if local_cluster is None:
        pytest.skip("stops and starts control-plane processes: needs the session's own local cluster")
    return Campaign(local_cluster)


def passed(outcome: Outcome) -> bool:
    assert outcome.passed, f"{outcome.scenario}: {outcome.problems}"
    return True


@pytest.mark.parametrize("point", FAST_KILL_POINTS)
def test_the_operator_killed_at_a_write_point_converges_after_a_restart(
    campaign: Campaign, point: str
) -> None:
    kind = dict(KILL_POINTS)[point]
    variant = 40 + FAST_KILL_POINTS.index(point)
    outcome = kill_at(campaign, point, kind, variant)
    assert passed(outcome)
    assert outcome.figures["duplicate_jobs"] == 0
    assert outcome.figures["orphans"] == 0


def test_the_operator_rides_out_an_apiserver_restart_and_watches_resumed_into_410_gone(
    campaign: Campaign,
) -> None:
    outcome = control_plane_restart(campaign, "kube-apiserver")
    assert passed(outcome)
    assert outcome.figures["compacted_revision"] > 0


def test_the_operator_rides_out_an_etcd_restart(campaign: Campaign) -> None:
    assert passed(control_plane_restart(campaign, "etcd"))


def test_a_standby_replica_writes_nothing_then_takes_over_when_the_active_one_is_killed(
    campaign: Campaign,
) -> None:
    outcome = takeover(campaign)
    assert passed(outcome)
    assert outcome.figures["standby_writes"] == 0


def test_a_deployment_deleted_mid_build_leaves_no_engine_job_or_child(campaign: Campaign) -> None:
    assert passed(deleted_mid_build(campaign))


def test_63_character_names_give_valid_child_names_and_converge(campaign: Campaign) -> None:
    assert passed(long_names(campaign))


def test_a_write_rbac_forbids_is_reported_backed_off_and_converges_once_the_role_is_whole(
    campaign: Campaign,
) -> None:
    outcome = rbac_forbidden(campaign, backoff_to=1.0)
    assert passed(outcome)
    assert outcome.figures["forbidden_events"] == 1


def test_a_namespace_deleted_under_a_ready_deployment_goes_without_a_fight(campaign: Campaign) -> None:
    outcome = terminating_namespace(campaign)
    assert passed(outcome)
    assert outcome.figures["tracebacks"] == 0


def test_every_owned_kind_edited_or_deleted_by_hand_is_repaired_on_its_watch_event(
    campaign: Campaign,
) -> None:
    outcomes = drift(campaign)
    failed = [f"{o.scenario}: {o.problems}" for o in outcomes if not o.passed]
    assert not failed, failed
    kinds = {o.scenario for o in outcomes}
    assert len(kinds) == 14, sorted(kinds)
    for o in outcomes:
        # Edits that start no pod change nothing the status counts; a Deployment scaled or its template
        # edited runs extra pods until the revert, and the status may count them.
        kind = o.scenario.removeprefix("drift: ").split()[0]
        if "edited" in o.scenario and kind not in ("EngineBuild", "Deployment"):
            assert o.figures["status_writes"] == 0, f"{o.scenario}: nothing a user relies on changed"
