"""Drift: another actor edits or deletes what the operator owns, one kind at a time, on one Ready deployment.
Each case starts once the operator has written no status for a few seconds, and is timed from the API
server's answer to the edit until the object is as the operator renders it again, and charged the
operator's writes and status writes over that time; a field edit must be repaired on its watch event (well
before the 60 s resync) without a status flap: the phase stays Ready and no condition changes, unless the
Deployment's controller acted on the edit before the revert and replaced a serving pod (then the deployment
really rolled: `Deploying` is the truth, and it must be Ready again). Status writes are counted, not
forbidden: a Deployment scaled by hand really runs the extra pods for a moment, and the status counts them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .campaign import GROUP_PATH, Campaign, Outcome, api_requests, deployment, status_writes

MERGE = "application/merge-patch+json"
REPAIR_BOUND_SECONDS = 15.0
"""A repair within this came from the edit's watch event: the campaign's operators resync every 60 s."""
SETTLE_SECONDS = 1.5
"""Requests charged to a case are those until the operator has made none for this long after the repair (a
status write it caused)."""
QUIET_SECONDS = 3.0
"""A case starts once the operator has written no status for this long (what an earlier case or the HPA's
first syncs caused is not charged to it)."""
QUIET_BOUND_SECONDS = 60.0


@dataclass(frozen=True)
class Case:
    """One edit or deletion: `path` of the object, what is done to it, and when it counts as repaired."""

    scenario: str
    kind: str
    path: str
    action: Callable[[Campaign], None]
    repaired: Callable[[dict[str, Any] | None], bool]
    edit: bool  # a field edit (no status write allowed), not a deletion


def _get(c: Campaign, path: str) -> dict[str, Any] | None:
    try:
        got: dict[str, Any] = c.cluster.api("GET", path)
    except OSError:
        return None
    return got


def _dig(obj: dict[str, Any] | None, *keys: Any) -> Any:
    value: Any = obj
    for key in keys:
        if value is None:
            return None
        value = value[key] if isinstance(key, int) and isinstance(value, list) else value.get(key)
    return value


def cases(c: Campaign, ns: str, name: str) -> list[Case]:
    """Every owned kind: its fields the operator renders, edited; the object deleted."""
    core, apps = f"/api/v1/namespaces/{ns}", f"/apis/apps/v1/namespaces/{ns}"
    paths = {
        "ConfigMap": f"{core}/configmaps/{name}-server-config",
        "Service": f"{core}/services/{name}",
        "PodDisruptionBudget": f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{name}",
        "Deployment": f"{apps}/deployments/{name}",
        "HorizontalPodAutoscaler": f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/{name}",
    }
    live = {kind: _get(c, path) for kind, path in paths.items()}
    missing = [kind for kind, obj in live.items() if obj is None]
    if missing:
        raise TimeoutError(f"no {', '.join(missing)} to edit")
    config = _dig(live["ConfigMap"], "data")
    port = _dig(live["Service"], "spec", "ports", 0, "port")
    min_available = _dig(live["PodDisruptionBudget"], "spec", "minAvailable")
    replicas = _dig(live["Deployment"], "spec", "replicas")
    image = _dig(live["Deployment"], "spec", "template", "spec", "containers", 0, "image")
    max_replicas = _dig(live["HorizontalPodAutoscaler"], "spec", "maxReplicas")
    container = _dig(live["Deployment"], "spec", "template", "spec", "containers", 0, "name")

    def patch(path: str, body: dict[str, Any]) -> Callable[[Campaign], None]:
        return lambda c: c.cluster.api("PATCH", path, body, content_type=MERGE)

    def delete(path: str) -> Callable[[Campaign], None]:
        return lambda c: c.cluster.api("DELETE", path)

    def back(check: Callable[[dict[str, Any]], bool]) -> Callable[[dict[str, Any] | None], bool]:
        return lambda obj: obj is not None and not _dig(obj, "metadata", "deletionTimestamp") and check(obj)

    def recreated(uid: str) -> Callable[[dict[str, Any] | None], bool]:
        return back(lambda obj: _dig(obj, "metadata", "uid") != uid)

    return [
        Case(
            "ConfigMap data edited",
            "ConfigMap",
            paths["ConfigMap"],
            patch(paths["ConfigMap"], {"data": {"server.yaml": "{}"}}),
            back(lambda o: o.get("data") == config),
            True,
        ),
        Case(
            "Service port edited",
            "Service",
            paths["Service"],
            patch(paths["Service"], {"spec": {"ports": [{"name": "http", "port": 9999, "targetPort": "x"}]}}),
            back(lambda o: _dig(o, "spec", "ports", 0, "port") == port and len(o["spec"]["ports"]) == 1),
            True,
        ),
        Case(
            "PodDisruptionBudget minAvailable edited",
            "PodDisruptionBudget",
            paths["PodDisruptionBudget"],
            patch(paths["PodDisruptionBudget"], {"spec": {"minAvailable": 7}}),
            back(lambda o: _dig(o, "spec", "minAvailable") == min_available),
            True,
        ),
        Case(
            "Deployment scaled by hand",
            "Deployment",
            paths["Deployment"],
            patch(paths["Deployment"], {"spec": {"replicas": int(replicas or 1) + 3}}),
            back(lambda o: _dig(o, "spec", "replicas") == replicas),
            True,
        ),
        Case(
            "Deployment pod template edited (image)",
            "Deployment",
            paths["Deployment"],
            patch(
                paths["Deployment"],
                {"spec": {"template": {"spec": {"containers": [{"name": container, "image": "busybox:1"}]}}}},
            ),
            back(lambda o: _dig(o, "spec", "template", "spec", "containers", 0, "image") == image),
            True,
        ),
        Case(
            "HorizontalPodAutoscaler maxReplicas edited",
            "HorizontalPodAutoscaler",
            paths["HorizontalPodAutoscaler"],
            patch(paths["HorizontalPodAutoscaler"], {"spec": {"maxReplicas": int(max_replicas or 1) + 5}}),
            back(lambda o: _dig(o, "spec", "maxReplicas") == max_replicas),
            True,
        ),
        *(
            Case(
                f"{kind} deleted",
                kind,
                path,
                delete(path),
                recreated(_dig(live[kind], "metadata", "uid")),
                False,
            )
            for kind, path in paths.items()
        ),
    ]


def _state(c: Campaign, ns: str, name: str) -> tuple[str, tuple[tuple[str, str, str], ...]]:
    """The deployment's phase and its conditions' (type, status, reason)."""
    status = (c.sdep(ns, name) or {}).get("status") or {}
    conditions = status.get("conditions") or ()
    summary = sorted((str(k.get("type")), str(k.get("status")), str(k.get("reason"))) for k in conditions)
    return str(status.get("phase")), tuple(summary)


def _serving_pods(c: Campaign, ns: str, name: str) -> set[str]:
    """UIDs of the deployment's serving pods that are not being deleted."""
    selector = f"app.kubernetes.io/instance={name},app.kubernetes.io/component=server"
    pods = c.items(f"/api/v1/namespaces/{ns}/pods?labelSelector={selector}")
    return {str(p["metadata"]["uid"]) for p in pods if not p["metadata"].get("deletionTimestamp")}


def _quiet(op: Any) -> None:
    """Wait until the operator has written no status for ``QUIET_SECONDS`` (at most ``QUIET_BOUND_SECONDS``:
    a status that never settles is then charged to the case, which fails it)."""
    deadline = time.monotonic() + QUIET_BOUND_SECONDS
    last, since = status_writes(op), time.monotonic()
    while time.monotonic() < deadline and time.monotonic() - since < QUIET_SECONDS:
        time.sleep(0.25)
        now = status_writes(op)
        if now != last:
            last, since = now, time.monotonic()


def run_case(c: Campaign, op: Any, ns: str, name: str, case: Case) -> Outcome:
    checked = (
        "reverted on the watch event: phase stays Ready, no condition changes"
        if case.edit
        else "recreated as rendered; Ready again; no orphan"
    )
    outcome = Outcome(f"drift: {case.scenario}", f"{case.scenario} by another actor", checked)
    _quiet(op)
    writes, statuses = api_requests(op, writes_only=True), status_writes(op)
    phases: list[tuple[str, tuple[tuple[str, str, str], ...]]] = [_state(c, ns, name)]
    serving = _serving_pods(c, ns, name)
    case.action(c)
    start = time.monotonic()
    repaired_after: float | None = None
    while time.monotonic() - start < REPAIR_BOUND_SECONDS:
        phases.append(_state(c, ns, name))
        if case.repaired(_get(c, case.path)):
            repaired_after = time.monotonic() - start
            break
        time.sleep(0.05)
    if repaired_after is None:
        outcome.expect(False, f"not repaired within {REPAIR_BOUND_SECONDS:.0f} s")
        return outcome
    outcome.figures["repair_seconds"] = repaired_after
    if not case.edit:
        c.wait(lambda: c.ready(ns, name), 120, f"{name} Ready again")
    deadline = time.monotonic() + QUIET_BOUND_SECONDS
    last, since = (api_requests(op, writes_only=True), status_writes(op)), time.monotonic()
    while time.monotonic() - since < SETTLE_SECONDS and time.monotonic() < deadline:
        phases.append(_state(c, ns, name))
        time.sleep(0.05)
        now = (api_requests(op, writes_only=True), status_writes(op))
        if now != last:
            last, since = now, time.monotonic()
    outcome.figures["operator_writes"] = api_requests(op, writes_only=True) - writes
    outcome.figures["status_writes"] = status_writes(op) - statuses
    if case.edit:
        # The Deployment's controller sees the edit when the operator does: with maxSurge 0 (the default),
        # a template edit it acts on before the revert lands replaces a serving pod. Then the deployment
        # really rolled and a phase that says so is the truth; with every serving pod untouched, it is a flap.
        replaced = len(serving - _serving_pods(c, ns, name))
        outcome.figures["serving_pods_replaced"] = replaced
        left = sorted({phase for phase, _ in phases if phase != "Ready"})
        flapped = sorted({cond for _, conds in phases for cond in conds} - set(phases[0][1]))
        if replaced:
            rolled = {("Progressing", "True", "RolloutInProgress")}
            outcome.expect(set(left) <= {"Deploying"}, f"the phase left Ready for {left}")
            outcome.expect(set(flapped) <= rolled, f"conditions changed: {flapped}")
            c.wait(lambda: c.ready(ns, name), 120, f"{name} Ready again")
        else:
            outcome.expect(not left, f"the phase left Ready while no serving pod was replaced: {left}")
            outcome.expect(not flapped, f"conditions changed while no serving pod was replaced: {flapped}")
    c.converged(outcome, ns, [name])
    return outcome


def engine_cases(c: Campaign, op: Any, ns: str, name: str) -> list[Outcome]:
    """An EngineBuild's spec edited (refused: immutable), its status edited (the build Job wins), and the
    EngineBuild deleted (created again; its engine built once more by one Job)."""
    engines = c.items(f"{GROUP_PATH}/namespaces/{ns}/enginebuilds")
    engine = engines[0]["metadata"]["name"]
    path = f"{GROUP_PATH}/namespaces/{ns}/enginebuilds/{engine}"
    spec = Outcome(
        "drift: EngineBuild spec edited",
        "a merge patch of an EngineBuild's spec (its engine's hash)",
        "refused by the API server (the spec is immutable); nothing changes",
    )
    try:
        c.cluster.api("PATCH", path, {"spec": {"hash": "0" * 16}}, content_type=MERGE)
        spec.expect(False, "the edit of an immutable spec was admitted")
    except OSError as refused:
        spec.expect("422" in str(refused) or "Invalid" in str(refused), f"refused how? {refused}")
    spec.expect(_dig(_get(c, path), "spec", "hash") != "0" * 16, "the spec changed")
    failed = {"status": {"phase": "Failed", "message": "edited"}}
    status = run_case(
        c,
        op,
        ns,
        name,
        Case(
            "EngineBuild status edited (Succeeded to Failed)",
            "EngineBuild",
            path,
            lambda c: c.cluster.api("PATCH", f"{path}/status", failed, content_type=MERGE),
            lambda o: _dig(o, "status", "phase") == "Succeeded",
            False,  # correcting it is a status write; the deployment may show it for a moment
        ),
    )
    uid = _dig(_get(c, path), "metadata", "uid")

    def rebuilt(obj: dict[str, Any] | None) -> bool:
        new = obj is not None and obj["metadata"]["uid"] != uid
        return new and _dig(obj, "status", "phase") == "Succeeded"

    deleted = run_case(
        c,
        op,
        ns,
        name,
        Case(
            "EngineBuild deleted",
            "EngineBuild",
            path,
            lambda c: c.cluster.api("DELETE", path),
            rebuilt,
            False,
        ),
    )
    return [spec, status, deleted]


def drift(c: Campaign) -> list[Outcome]:
    """Every case on one Ready, autoscaled deployment (it has every kind of child) and one operator."""
    with c.scratch_namespace() as ns:
        op = c.operator(log="drift")
        setup = Outcome("drift", "", "")
        with c.trial(setup, op):
            name = "drift"
            c.apply(deployment("autoscaled", ns, name, 60))
            c.wait(lambda: c.ready(ns, name), 240, f"{name} Ready")
            outcomes = [run_case(c, op, ns, name, case) for case in cases(c, ns, name)]
            outcomes += engine_cases(c, op, ns, name)
        if not setup.passed:
            return [setup]
    return outcomes
