"""One pod's life on the pod runner, as a kubelet lives it: set up, init containers, containers and their
probes, restarts with back-off, status, and deletion (preStop, SIGTERM, the grace period, SIGKILL).

`PodWorker.run` is the pod's thread. The runner tells it about deletion (`delete`, with the grace period) and
about the pod object disappearing (`gone`); everything else the worker observes itself.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import signal
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from kubernetes import client
from kubernetes.client.rest import ApiException

from specdeploy_localcluster.paths import CHECKOUT
from specdeploy_localcluster.podnet import create_pod_netns, delete_pod_netns, netns_name

from .container import command_line, container_env, launch
from .kwokobjects import KwokObjects
from .probes import run_handler
from .process import ContainerRun, backoff_seconds, termination_message
from .security import apply_fs_group, hidden_ancestors, identity, privilege_drop
from .selection import ImageDefaults
from .volumes import Mount, PodNotReady, UnsupportedPod, container_mounts, prepare_volumes

__all__ = ["PodWorker", "now_rfc3339"]

log = logging.getLogger("podrunner")
TICK: Final = 0.2
DEFAULT_TERMINATION_PATH: Final = "/dev/termination-log"
"""The kubelet's default `terminationMessagePath`."""


def now_rfc3339() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def image_directories(venv_bin: Path) -> list[Path]:
    """The directories that make up the "image": the checkout, and the virtualenv where it lives elsewhere."""
    venv = venv_bin.parent
    roots = [CHECKOUT, venv.absolute()]
    return [root for i, root in enumerate(roots) if not any(other in root.parents for other in roots[:i])]


class PodWorker:
    """Runs one pod (a Pod as JSON, as first seen bound to a node)."""

    def __init__(
        self,
        api: client.ApiClient,
        pod: dict[str, Any],
        *,
        pod_dir: Path,
        pod_ip: str,
        node_ip: str,
        images: Mapping[str, ImageDefaults],
        venv_bin: Path,
        on_exit: Callable[[str], None],
    ) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.pod = pod
        self.meta = pod["metadata"]
        self.uid: str = self.meta["uid"]
        self.dir = pod_dir
        self.pod_ip = pod_ip
        self.node_ip = node_ip
        self.images = images
        self.venv_bin = venv_bin
        self.on_exit = on_exit
        self.kwok = KwokObjects(api, pod)
        spec = pod["spec"]
        self.policy: str = spec.get("restartPolicy", "Always")
        self.inits = [ContainerRun(c, init=True) for c in spec.get("initContainers") or []]
        self.mains = [ContainerRun(c, init=False) for c in spec.get("containers") or []]
        self.start_time = now_rfc3339()
        self.conditions: dict[str, tuple[str, str, str | None]] = {}
        self.phase = "Pending"
        self.message: str | None = None
        self.reason: str | None = None
        self.last_status: dict[str, Any] | None = None
        self.grace: float | None = None
        self.deleting = threading.Event()
        self.gone = threading.Event()
        self.volumes: dict[str, Path] = {}
        self.netns = netns_name(self.uid)
        self.thread = threading.Thread(target=self.run, name=f"pod-{self.meta['name']}", daemon=True)

    # -- signals from the runner --------------------------------------------------------------------------
    def delete(self, grace: float) -> None:
        if not self.deleting.is_set():
            self.grace = grace
            self.deleting.set()

    def vanish(self) -> None:
        self.gone.set()
        self.deleting.set()

    # -- the pod's thread ---------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._live()
        except UnsupportedPod as err:
            self.phase, self.reason, self.message = "Failed", "UnsupportedByPodRunner", str(err)
            self._push_status()
            self._wait_deleted()
        except Exception:
            log.exception("pod %s/%s: the runner failed", self.meta["namespace"], self.meta["name"])
            self._wait_deleted()
        finally:
            for run in [*self.inits, *self.mains]:
                run.kill()
            if not self.gone.is_set():
                self._remove_pod()
            shutil.rmtree(self.dir, ignore_errors=True)
            delete_pod_netns(self.uid, self.pod_ip)
            self.on_exit(self.uid)

    def _live(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.netns = create_pod_netns(self.uid, self.pod_ip)
        while True:
            try:
                self.volumes = prepare_volumes(self.core, self._pod_with_ip(), self.dir)
                claims = {
                    v["name"] for v in self.pod["spec"].get("volumes") or [] if "persistentVolumeClaim" in v
                }
                apply_fs_group(self.pod, self.volumes, claims)
                break
            except PodNotReady as err:
                self.reason, self.message = "ContainerCreating", str(err)
                self._push_status()
                if self.deleting.wait(1.0):
                    return
        self.reason = self.message = None
        for run in self.inits:
            if not self._run_init(run):
                return
        for run in self.mains:
            self._start(run)
        self._push_status()
        while not self.deleting.is_set():
            now = time.monotonic()
            for run in self.mains:
                self._step(run, now)
            self._update_phase()
            self._push_status()
            self.deleting.wait(TICK)
        if not self.gone.is_set():
            self._terminate()

    def _wait_deleted(self) -> None:
        self.deleting.wait()

    def _pod_with_ip(self) -> dict[str, Any]:
        return {
            **self.pod,
            "status": {**(self.pod.get("status") or {}), "podIP": self.pod_ip, "hostIP": self.node_ip},
        }

    def _env_for(self, run: ContainerRun) -> dict[str, str]:
        if run.env is None:
            image = self.images[run.spec["image"]]
            run.env = container_env(self.core, self._pod_with_ip(), run.spec, self.venv_bin, image)
        return run.env

    def _start(self, run: ContainerRun) -> None:
        env = self._env_for(run)
        image = self.images[run.spec["image"]]
        log_path = self.dir / "logs" / f"{run.name}-{run.restarts}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        mounts = container_mounts(run.spec, self.volumes)
        # terminationMessagePath: a file of its own bound at the path, read back when the process exits. It is
        # mounted first: a volume at /tmp (every hardened pod has one) would hide its source here.
        termination = self.dir / "termination" / f"{run.name}-{run.restarts}"
        termination.parent.mkdir(parents=True, exist_ok=True)
        termination.write_bytes(b"")
        termination.chmod(0o666)
        target = run.spec.get("terminationMessagePath") or DEFAULT_TERMINATION_PATH
        mounts.insert(0, Mount(termination, target, read_only=False))
        run.termination_path = termination
        who = identity(self.pod, run.spec, image)
        proc = launch(
            argv=[*privilege_drop(who), *command_line(run.spec, env, image)],
            env=env,
            mounts=mounts,
            workdir=run.spec.get("workingDir") or image.workdir,
            script=self.dir / f"run-{run.name}.sh",
            log_path=log_path,
            netns=self.netns,
            read_only_root=who.read_only_root,
            exposed=hidden_ancestors([self.venv_bin / "python"]) if who.uid != 0 else None,
            image=image_directories(self.venv_bin),
        )
        run.started_process(proc, log_path, now_rfc3339(), time.monotonic())
        self.kwok.apply(self.inits + self.mains, self.pod_ip, self._env_for)
        log.info(
            "pod %s/%s: started %s (pid %d)", self.meta["namespace"], self.meta["name"], run.name, proc.pid
        )

    def _run_init(self, run: ContainerRun) -> bool:
        """Run an init container until it succeeds (restarting per policy); False if the pod failed or is
        being deleted."""
        while not self.deleting.is_set():
            if run.proc is None and time.monotonic() >= run.backoff_until:
                self._start(run)
                self._push_status()
            if run.proc is not None and run.proc.poll() is not None:
                code = run.exited(now_rfc3339(), termination_message(run))
                self._push_status()
                if code == 0:
                    return True
                if self.policy == "Never":
                    self.phase = "Failed"
                    self._push_status()
                    self._wait_deleted()
                    return False
                run.schedule_restart(time.monotonic() + backoff_seconds(run.restarts))
            self.deleting.wait(TICK)
        return False

    def _step(self, run: ContainerRun, now: float) -> None:
        if run.proc is not None and run.proc.poll() is not None:
            code = run.exited(now_rfc3339(), termination_message(run))
            if self.policy == "Always" or (self.policy == "OnFailure" and code != 0):
                delay = backoff_seconds(run.restarts) if run.ran_for(now) < 600 else 0.0
                run.schedule_restart(now + delay)
            return
        if run.proc is None:
            if run.restart_pending and now >= run.backoff_until:
                self._start(run)
            return
        for kind, state in run.probes.items():
            if kind != "startup" and not run.started:
                continue
            if kind == "startup" and run.started:
                continue
            if not state.due(now):
                continue
            ok = run_handler(
                state.spec,
                container=run.spec,
                pod_ip=self.pod_ip,
                env=self._env_for(run),
                timeout=state.timeout,
                netns=self.netns,
            )
            verdict = state.record(ok, now)
            if kind == "startup" and verdict:
                run.started = True
            elif kind == "readiness":
                run.ready = bool(verdict)
            if verdict is False and kind in ("startup", "liveness"):
                log.info("pod %s: %s probe of %s failed: restarting it", self.meta["name"], kind, run.name)
                run.stop(self._grace_seconds())

    def _grace_seconds(self) -> float:
        return float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))

    def _update_phase(self) -> None:
        if self.policy == "Always" or any(not r.finished for r in self.mains):
            self.phase = "Running" if any(r.proc is not None for r in self.mains) else self.phase
            return
        self.phase = "Succeeded" if all(r.exit_code == 0 for r in self.mains) else "Failed"

    def _terminate(self) -> None:
        """preStop hooks, then SIGTERM, then SIGKILL when the grace period (counted from now) ends."""
        grace = self._grace_seconds() if self.grace is None else self.grace
        deadline = time.monotonic() + grace
        running = [r for r in self.mains if r.proc is not None and r.proc.poll() is None]
        hooks = []
        for run in running:
            pre_stop = (run.spec.get("lifecycle") or {}).get("preStop")
            if pre_stop and grace > 0:
                env = self._env_for(run)
                hook = threading.Thread(
                    target=run_handler,
                    args=(pre_stop,),
                    kwargs={
                        "container": run.spec,
                        "pod_ip": self.pod_ip,
                        "env": env,
                        "timeout": grace,
                        "netns": self.netns,
                    },
                    daemon=True,
                )
                hook.start()
                hooks.append(hook)
        for hook in hooks:
            hook.join(max(deadline - time.monotonic(), 0))
        for run in running:
            run.signal(signal.SIGTERM)
        while time.monotonic() < deadline and any(
            r.proc is not None and r.proc.poll() is None for r in running
        ):
            time.sleep(0.1)
        for run in running:
            run.kill()
        log.info("pod %s/%s: stopped", self.meta["namespace"], self.meta["name"])

    def _remove_pod(self) -> None:
        with contextlib.suppress(ApiException):
            self.core.delete_namespaced_pod(
                self.meta["name"],
                self.meta["namespace"],
                grace_period_seconds=0,
                body=client.V1DeleteOptions(
                    grace_period_seconds=0, preconditions=client.V1Preconditions(uid=self.uid)
                ),
            )

    # -- status -------------------------------------------------------------------------------------------
    def _condition(self, kind: str, ok: bool, reason: str | None = None) -> dict[str, Any]:
        value = "True" if ok else "False"
        previous = self.conditions.get(kind)
        if previous is None or previous[0] != value:
            self.conditions[kind] = (value, now_rfc3339(), reason)
        status, since, why = self.conditions[kind]
        out: dict[str, Any] = {"type": kind, "status": status, "lastTransitionTime": since}
        if why and status == "False":
            out["reason"] = why
        return out

    def status(self) -> dict[str, Any]:
        initialized = all(r.exit_code == 0 for r in self.inits)
        ready = self.phase == "Running" and all(r.ready for r in self.mains) and not self.deleting.is_set()
        finished = self.phase in ("Succeeded", "Failed")
        status: dict[str, Any] = {
            "phase": self.phase,
            "hostIP": self.node_ip,
            "hostIPs": [{"ip": self.node_ip}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "conditions": [
                self._condition("PodScheduled", True),
                self._condition("Initialized", initialized, "ContainersNotInitialized"),
                self._condition(
                    "ContainersReady", ready, "PodCompleted" if finished else "ContainersNotReady"
                ),
                self._condition("Ready", ready, "PodCompleted" if finished else "ContainersNotReady"),
            ],
            "containerStatuses": [r.status(self.reason) for r in self.mains],
            "message": self.message,
            "reason": self.reason if self.phase == "Failed" else None,
        }
        if self.inits:
            status["initContainerStatuses"] = [r.status(self.reason) for r in self.inits]
        return status

    def _push_status(self) -> None:
        status = self.status()
        if status == self.last_status or self.gone.is_set():
            return
        try:
            self.core.patch_namespaced_pod_status(
                self.meta["name"],
                self.meta["namespace"],
                {"metadata": {"uid": self.uid}, "status": status},
                _content_type="application/merge-patch+json",
            )
        except ApiException as err:
            if err.status == 404:
                self.vanish()
                return
            if err.status != 409:
                raise
        self.last_status = status
