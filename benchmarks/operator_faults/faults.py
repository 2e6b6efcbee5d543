"""Faults injected into the operator and the control plane: SIGKILL at named write points, kube-apiserver or
etcd stopped mid-rollout, the active replica of two killed."""

from __future__ import annotations

from specdeploy_localcluster.operatorproc import OperatorProcess

from .campaign import (
    GROUP_PATH,
    PEERING_CRDS,
    Campaign,
    Outcome,
    api_requests,
    deployment,
    reconcile_errors,
)


def kill_at(c: Campaign, point: str, kind: str, variant: int) -> Outcome:
    """SIGKILL the operator when it reaches `point`, start it again, check convergence."""
    outcome = Outcome(
        f"SIGKILL at `{point}`",
        f"operator killed by a failpoint at `{point}`, then restarted",
        "converges: Ready, 1 Job per engine, no orphan, status current",
    )
    # The GC case keeps no engine for rollback, so the old ones are deleted once unused.
    env = {"SPECDEPLOY_KEEP_PREVIOUS_ENGINES": "0"} if kind == "gc" else {}
    with c.scratch_namespace() as ns:
        name = f"kill-{variant}"
        doc = deployment(kind, ns, name, variant)
        if kind == "gc":  # the kill comes when an engine the deployment no longer uses is deleted
            setup = c.operator(env=env, log=f"kill-{variant}")
            setup.start()
            c.apply(doc)
            c.wait(lambda: c.ready(ns, name), 180, f"{name} Ready")
            setup.stop()
            doc["spec"]["speculative"]["maxDraftLen"] = (
                20 + variant
            )  # new engines; the old ones become garbage
        first = c.operator(env={**env, "SPECDEPLOY_FAILPOINT": point}, log=f"kill-{variant}")
        first.start()
        c.apply(doc)
        code = first.wait_exit(120)
        outcome.expect(code == -9, f"the failpoint was not reached (exit {code})")
        if code is None:
            first.kill()
        second = c.operator(env=env, log=f"kill-{variant}")
        second.start()
        try:
            outcome.figures["converge_seconds"] = c.wait(lambda: c.ready(ns, name), 240, f"{name} Ready")
            if kind == "gc":
                c.wait(
                    lambda: len(c.items(f"{GROUP_PATH}/namespaces/{ns}/enginebuilds")) == 2,
                    60,
                    "old engines gone",
                )
            c.converged(outcome, ns, [name])
        except TimeoutError as error:
            outcome.expect(False, str(error))
        finally:
            second.stop()
    return outcome


def control_plane_restart(c: Campaign, component: str) -> Outcome:
    """Stop kube-apiserver (and compact etcd's history meanwhile, so resumed watches get 410 Gone) or etcd in
    the middle of a build and rollout, until the outage shows (the operator's requests fail; the apiserver is
    not ready without its storage); start it again; the same operator process must converge."""
    injected = f"{component} stopped mid-rollout until the outage showed" + (
        ", etcd compacted meanwhile (watches resume into 410 Gone)" if component == "kube-apiserver" else ""
    )
    outcome = Outcome(
        f"{component} restart", injected, "operator keeps running (no restart), converges, logs errors"
    )
    with c.scratch_namespace() as ns:
        op = c.operator(log=f"cp-{component}")
        with c.trial(outcome, op):
            name = "cp"
            c.apply(deployment("build", ns, name, 0))
            c.wait(lambda: c.items(f"/apis/batch/v1/namespaces/{ns}/jobs"), 60, "a build Job")
            errors_before = reconcile_errors(op)
            log_start = op.log.stat().st_size
            c.cluster.stop_component(component)
            if component == "kube-apiserver":  # kopf's watches break and their reconnections fail
                c.wait(lambda: RETRIED in op_log_since(op, log_start), 60, "the operator's requests failing")
                outcome.figures["compacted_revision"] = float(c.cluster.compact_etcd())
            else:
                c.wait(lambda: not c.cluster.apiserver_ready(), 60, "the apiserver not ready without etcd")
            c.cluster.start_component(component)
            if component == "etcd":  # the apiserver reconnects by itself
                c.wait(c.cluster.apiserver_ready, 60, "the apiserver back")
            outcome.figures["converge_seconds"] = c.wait(lambda: c.ready(ns, name), 240, f"{name} Ready")
            outcome.expect(op.running and op.starts == 1, "the operator process restarted or exited")
            outcome.figures["reconcile_errors"] = reconcile_errors(op) - errors_before
            c.converged(outcome, ns, [name])
    return outcome


RETRIED = "failed; will retry"
"""What kopf logs when a request to the API server fails (a watch's reconnection among them)."""


def op_log_since(op: OperatorProcess, offset: int) -> str:
    with op.log.open("rb") as log:
        log.seek(offset)
        return log.read().decode(errors="replace")


def takeover(c: Campaign, lifetime: int = 10) -> Outcome:
    """Two replicas with kopf peering: the standby writes nothing while the active one works; the active one
    is killed mid-change; the standby takes over within the peering lifetime and converges."""
    outcome = Outcome(
        "high availability: active replica killed",
        f"2 replicas (peering, lifetime {lifetime} s); active SIGKILLed after a spec change",
        "standby made 0 writes while standby; takes over and converges; 1 Job per engine",
    )
    c.kubectl("apply", "--server-side", "-f", str(PEERING_CRDS))
    with c.scratch_namespace() as ns:
        c.apply(
            {
                "apiVersion": "kopf.dev/v1",
                "kind": "KopfPeering",
                "metadata": {"name": "specdeploy", "namespace": ns},
            }
        )
        env = {"SPECDEPLOY_WATCH_NAMESPACES": ns, "SPECDEPLOY_PEERING_LIFETIME_SECONDS": str(lifetime)}
        replicas = [c.operator(env=env, args=("--peering=specdeploy",), log=f"ha-{i}") for i in (0, 1)]
        with c.trial(outcome, *replicas):
            peering = f"/apis/kopf.dev/v1/namespaces/{ns}/kopfpeerings/specdeploy"
            c.wait(
                lambda: len(c.cluster.api("GET", peering).get("status") or {}) >= 2,
                60,
                "both replicas in the peering record",
            )
            name = "ha"
            doc = deployment("build", ns, name, 0)
            c.apply(doc)
            c.wait(lambda: c.ready(ns, name), 240, f"{name} Ready")
            writes = [api_requests(op, writes_only=True) for op in replicas]
            active = max(range(2), key=lambda i: writes[i])
            standby = 1 - active
            outcome.figures["standby_writes"] = writes[standby]
            outcome.expect(writes[standby] == 0, f"the standby wrote {writes[standby]:.0f} times")
            doc["spec"]["replicas"] = 3
            c.apply(doc)
            replicas[active].kill()
            outcome.figures["takeover_seconds"] = c.wait(
                lambda: c.ready(ns, name, 3), 180, "the standby to converge"
            )
            outcome.expect(api_requests(replicas[standby]) > 0, "the standby never wrote")
            c.converged(outcome, ns, [name])
    return outcome
