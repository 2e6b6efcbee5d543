"""Bad states: a deployment deleted mid-build, 63-character names, a write RBAC forbids, a namespace deleted
under a running deployment."""

from __future__ import annotations

import copy
import itertools
import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml
from specdeploy_localcluster.operatorproc import OperatorProcess

from . import REPO
from .campaign import (
    GROUP_PATH,
    OPERATOR_ENV,
    OWNED_KINDS,
    Campaign,
    Outcome,
    api_requests,
    deployment,
    reconcile_errors,
)


def deleted_mid_build(c: Campaign) -> Outcome:
    outcome = Outcome(
        "deployment deleted mid-build",
        "SpeculativeDeployment deleted while its engines build",
        "children and engines garbage-collected, no orphan Job, operator healthy",
    )
    with c.scratch_namespace() as ns:
        op = c.operator(log="deleted")
        with c.trial(outcome, op):
            c.apply(deployment("build", ns, "gone", 0))
            c.wait(lambda: c.items(f"/apis/batch/v1/namespaces/{ns}/jobs"), 60, "a build Job")
            c.kubectl("delete", "sdep", "gone", "-n", ns)
            outcome.figures["cleanup_seconds"] = c.wait(
                lambda: (
                    not c.items(f"{GROUP_PATH}/namespaces/{ns}/enginebuilds")
                    and not c.items(f"/apis/batch/v1/namespaces/{ns}/jobs")
                ),
                120,
                "engines and Jobs collected",
            )
            outcome.expect(op.running and op.healthy(), "the operator is not healthy")
            c.converged(outcome, ns, [])
    return outcome


def long_names(c: Campaign) -> Outcome:
    outcome = Outcome(
        "63-character names",
        "a deployment named with 63 characters (the longest DNS label)",
        "every derived child name valid; Ready; no orphan",
    )
    with c.scratch_namespace() as ns, c.trial(outcome, c.operator(log="names")):
        name = ("n" * 62) + "x"
        c.apply(deployment("build", ns, name, 0))
        outcome.figures["converge_seconds"] = c.wait(lambda: c.ready(ns, name), 240, "Ready")
        for plural, prefix in {**OWNED_KINDS, "enginebuilds": GROUP_PATH}.items():
            for obj in c.items(f"{prefix}/namespaces/{ns}/{plural}"):
                child = obj["metadata"]["name"]
                limit = 63 if plural in ("services", "jobs") else 253
                outcome.expect(len(child) <= limit, f"{plural}/{child} longer than {limit}")
        c.converged(outcome, ns, [name])
    return outcome


def _chart_rbac(c: Campaign, ns: str) -> list[dict[str, Any]]:
    """The chart's own RBAC for an install in `ns` watching only `ns` (Role, RoleBinding, ServiceAccount and
    the framework's cluster-wide read-only ClusterRole), rendered by `helm template`."""
    rendered = subprocess.run(
        [
            str(c.cluster.bin_dir / "helm"),
            "template",
            "rb",
            str(REPO / "charts" / "specdeploy"),
            "--namespace",
            ns,
            "--set",
            f"watchNamespaces={{{ns}}}",
            "--show-only",
            "templates/rbac.yaml",
            "--show-only",
            "templates/serviceaccount.yaml",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def _without_pdb_writes(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The same RBAC with the Role's create/patch of PodDisruptionBudgets taken away (a chart upgrade that
    lost a rule, a hand-tightened Role): reads stay, so the operator's watches keep working."""
    tightened = copy.deepcopy(docs)
    for doc in tightened:
        if doc["kind"] != "Role":
            continue
        for rule in doc["rules"]:
            if "poddisruptionbudgets" in rule["resources"]:
                rule["verbs"] = [v for v in rule["verbs"] if v in ("get", "list", "watch")]
    return tightened


def _token_kubeconfig(c: Campaign, ns: str, account: str, path: Path) -> Path:
    """A kubeconfig with the cluster's server and CA and a token of `account` as its only credential."""
    token = c.kubectl("create", "token", account, "-n", ns, "--duration=1h").strip()
    admin = yaml.safe_load(c.cluster.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "local", "cluster": cluster}],
                "users": [{"name": account, "user": {"token": token}}],
                "contexts": [{"name": "sa", "context": {"cluster": "local", "user": account}}],
                "current-context": "sa",
            }
        )
    )
    path.chmod(0o600)
    return path


def _condition(obj: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or ()
    return next((cond for cond in conditions if cond.get("type") == kind), {})


def retries_logged(op: OperatorProcess, namespace: str, name: str) -> list[float]:
    """The delays (`retry_in`, seconds) the operator's log gives each failed reconcile of the deployment
    `namespace/name`, in order."""
    delays = []
    for line in op.log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        key = str(entry.get("key", ""))
        if (
            entry.get("message") == "reconcile failed; retrying"
            and f"'{namespace}'" in key
            and f"'{name}'" in key
        ):
            delays.append(float(entry["retry_in"]))
    return delays


def rbac_forbidden(c: Campaign, backoff_to: float = 10.0) -> Outcome:
    """The operator runs as the chart's ServiceAccount with the chart's Role minus PodDisruptionBudget writes;
    the denial must show as condition `Synced=False/Forbidden` and one event, retried with back-off (no hot
    loop: each retry waits twice the last, and makes one refused write), and the deployment must converge
    once the Role is whole again. The Role is repaired once a retry waits `backoff_to` seconds or more."""
    outcome = Outcome(
        "write forbidden by RBAC",
        "the chart's Role (namespaced install) without create/patch of PodDisruptionBudgets; restored once "
        f"the retries back off to {backoff_to:g} s",
        "Synced=False reason Forbidden naming the verb and resource; 1 event; each retry twice as late, one "
        "refused write each; Ready within a minute of the Role's repair",
    )
    with c.scratch_namespace() as ns, tempfile.TemporaryDirectory() as tmp:
        rbac = _chart_rbac(c, ns)
        account = next(d["metadata"]["name"] for d in rbac if d["kind"] == "ServiceAccount")
        c.apply_list(_without_pdb_writes(rbac))
        kubeconfig = _token_kubeconfig(c, ns, account, Path(tmp) / "sa.kubeconfig")
        op = OperatorProcess(
            kubeconfig,
            c.cluster.logs,
            env={**OPERATOR_ENV, "SPECDEPLOY_WATCH_NAMESPACES": ns},
            log_name="chaos-rbac.log",
        )
        try:
            with c.trial(outcome, op):
                name = "rbac"
                c.apply(deployment("build", ns, name, 50))
                c.wait(
                    lambda: _condition(c.sdep(ns, name), "Synced").get("reason") == "Forbidden",
                    180,
                    "Synced=False/Forbidden",
                )
                refused_before = api_requests(op, status="403")
                retried_before = len(retries_logged(op, ns, name))
                watched = c.wait(
                    lambda: any(d >= backoff_to for d in retries_logged(op, ns, name)[retried_before:]),
                    600,
                    f"a retry {backoff_to:g} s after the last",
                )
                delays = retries_logged(op, ns, name)[retried_before:]
                refused = api_requests(op, status="403") - refused_before
                outcome.figures["refused_requests"] = refused
                outcome.figures["refused_per_minute"] = refused * 60.0 / max(watched, 1.0)
                outcome.figures["retries"] = float(len(delays))
                outcome.expect(
                    all(later >= earlier for earlier, later in itertools.pairwise(delays)),
                    f"retries not backing off: {delays}",
                )
                # One refused write per retry (a hot loop beside the retries would show as more).
                outcome.expect(
                    refused <= len(delays) + 1, f"{refused:.0f} refused requests, {len(delays)} retries"
                )
                synced = _condition(c.sdep(ns, name), "Synced")
                message = str(synced.get("message"))
                outcome.expect(
                    'cannot patch resource "poddisruptionbudgets"' in message,
                    f"the condition does not name the verb and resource: {message[:200]}",
                )
                events = [
                    e
                    for e in c.items(f"/api/v1/namespaces/{ns}/events")
                    if e["involvedObject"].get("name") == name and e.get("reason") == "Forbidden"
                ]
                outcome.figures["forbidden_events"] = float(sum(int(e.get("count") or 1) for e in events))
                outcome.expect(len(events) == 1, f"{len(events)} Forbidden events, not 1")
                outcome.expect(op.running and op.starts == 1, "the operator exited or restarted")
                c.apply_list(rbac)  # the Role whole again
                outcome.figures["recovery_seconds"] = c.wait(
                    lambda: c.ready(ns, name), 120, f"{name} Ready after the Role's repair"
                )
                outcome.expect(
                    _condition(c.sdep(ns, name), "Synced").get("status") == "True", "Synced not True again"
                )
                c.converged(outcome, ns, [name])
        finally:
            for doc in rbac:
                if doc["kind"].startswith("Cluster"):
                    c.kubectl("delete", doc["kind"].lower(), doc["metadata"]["name"], "--ignore-not-found")
    return outcome


def terminating_namespace(c: Campaign) -> Outcome:
    """The namespace of a Ready deployment is deleted: the namespace controller deletes everything in it
    while the operator, seeing children vanish, must not fight it (creates there are refused with
    `NamespaceTerminating`), hold it up (no finalizer), crash or spin."""
    outcome = Outcome(
        "namespace terminating",
        "the namespace of a Ready deployment deleted",
        "namespace gone (no finalizer holds it); operator alive, not restarted, no traceback; few refusals",
    )
    with c.scratch_namespace() as ns:
        op = c.operator(log="terminating")
        with c.trial(outcome, op):
            name = "doomed"
            c.apply(deployment("build", ns, name, 55))
            c.wait(lambda: c.ready(ns, name), 240, f"{name} Ready")
            log_start = op.log.stat().st_size
            refused_before = api_requests(op, status="403")
            errors_before = reconcile_errors(op)
            c.kubectl("delete", "namespace", ns, "--wait=false")
            outcome.figures["namespace_gone_seconds"] = c.wait(
                lambda: not c.exists(f"/api/v1/namespaces/{ns}"), 180, f"namespace {ns} gone"
            )
            # What the operator does after the last watch events: over once its requests and reconciles stop.
            c.wait_quiet(
                lambda: (api_requests(op), reconcile_errors(op), op.log.stat().st_size),
                3,
                60,
                "the operator's requests, reconciles and log after the namespace went",
            )
            outcome.figures["refused_requests"] = api_requests(op, status="403") - refused_before
            outcome.figures["reconcile_errors"] = reconcile_errors(op) - errors_before
            with op.log.open("rb") as log:
                log.seek(log_start)
                tracebacks = log.read().count(b"Traceback")
            outcome.figures["tracebacks"] = float(tracebacks)
            outcome.expect(tracebacks == 0, f"{tracebacks} tracebacks in the operator's log")
            outcome.expect(op.running and op.starts == 1 and op.healthy(), "the operator is not healthy")
            outcome.expect(outcome.figures["refused_requests"] <= 5, "the operator kept writing into it")
    return outcome
