"""One container's process and what its status reports: state, last state, restarts, readiness."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from .probes import ProbeState

__all__ = ["ContainerRun", "backoff_seconds", "termination_message"]

BACKOFF_BASE_SECONDS: Final = 10.0
BACKOFF_MAX_SECONDS: Final = 300.0
_MESSAGE_BYTES: Final = 2048
_FILE_BYTES: Final = 4096
_MESSAGE_LINES: Final = 80


def backoff_seconds(restarts: int) -> float:
    """The kubelet's CrashLoopBackOff: 10 s before the first restart, doubling up to 5 minutes."""
    return min(BACKOFF_BASE_SECONDS * 2.0 ** max(restarts - 1, 0), BACKOFF_MAX_SECONDS)


def termination_message(run: ContainerRun) -> str | None:
    """The kubelet's termination message: what the process wrote to its `terminationMessagePath` (4 KiB at
    most), else, under `FallbackToLogsOnError` for a container that failed, the end of its log (2 KiB or 80
    lines)."""
    if run.termination_path is not None:
        try:
            written = run.termination_path.read_bytes()[:_FILE_BYTES].decode(errors="replace")
        except OSError:
            written = ""
        if written.strip():
            return written
    if run.spec.get("terminationMessagePolicy") != "FallbackToLogsOnError" or run.log_path is None:
        return None
    if run.proc is None or run.proc.returncode == 0:
        return None
    try:
        with run.log_path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(f.tell() - _MESSAGE_BYTES, 0))
            tail = f.read().decode(errors="replace")
    except OSError:
        return None
    # CRI lines: "<time> <stream> <F|P> <text>"; the message is the text.
    lines = [line.split(" ", 3)[3] if line.count(" ") >= 3 else line for line in tail.splitlines()]
    return "\n".join(lines[-_MESSAGE_LINES:]) or None


class ContainerRun:
    """A container of the pod: its current process (if any) and the facts its containerStatus reports."""

    def __init__(self, spec: Mapping[str, Any], init: bool) -> None:
        self.spec = spec
        self.name: str = spec["name"]
        self.init = init
        self.env: dict[str, str] | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.container_id: str | None = None  # the last process's, kept after it exits (as the kubelet does)
        self.log_path: Path | None = None
        self.termination_path: Path | None = None
        self.restarts = 0
        self.state: dict[str, Any] = {
            "waiting": {"reason": "PodInitializing" if not init else "ContainerCreating"}
        }
        self.last_state: dict[str, Any] = {}
        self.exit_code: int | None = None
        self.ready = False
        self.started = False
        self.started_mono = 0.0
        self.restart_pending = False
        self.backoff_until = 0.0
        self.probes: dict[str, ProbeState] = {}

    @property
    def finished(self) -> bool:
        return self.proc is None and not self.restart_pending and self.exit_code is not None

    def started_process(self, proc: subprocess.Popen[bytes], log_path: Path, at: str, mono: float) -> None:
        self.proc, self.log_path = proc, log_path
        self.container_id = f"podrunner://{proc.pid}"
        self.state = {"running": {"startedAt": at}}
        self.exit_code = None
        self.restart_pending = False
        self.started_mono = mono
        self.ready = False
        probes = {
            kind: self.spec[f"{kind}Probe"]
            for kind in ("startup", "readiness", "liveness")
            if self.spec.get(f"{kind}Probe")
        }
        self.probes = {kind: ProbeState(spec, mono) for kind, spec in probes.items()}
        self.started = "startup" not in self.probes
        if "readiness" not in self.probes:
            self.ready = not self.init

    def ran_for(self, now: float) -> float:
        return now - self.started_mono

    def exited(self, at: str, message: str | None) -> int:
        """Record the end of the process; returns its exit code (128 + signal for a killed process)."""
        assert self.proc is not None
        code = self.proc.returncode
        if code < 0:
            code = 128 - code
        started = self.state.get("running", {}).get("startedAt")
        terminated: dict[str, Any] = {
            "exitCode": code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": started,
            "finishedAt": at,
            "containerID": self.container_id,
        }
        if message:
            terminated["message"] = message
        self.state = {"terminated": terminated}
        self.exit_code = code
        self.proc = None
        self.ready = False
        self.started = False
        return code

    def schedule_restart(self, at: float) -> None:
        self.last_state = self.state
        self.restarts += 1
        self.restart_pending = True
        self.backoff_until = at
        wait = at - time.monotonic()
        reason = "CrashLoopBackOff" if wait > 0 else "ContainerCreating"
        message = f"back-off {wait:.0f}s restarting failed container={self.name}" if wait > 0 else None
        self.state = {"waiting": {"reason": reason, **({"message": message} if message else {})}}

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)

    def stop(self, grace: float) -> None:
        """SIGTERM, then SIGKILL after `grace` seconds (a failed liveness or startup probe)."""
        self.signal(signal.SIGTERM)
        if self.proc is None:
            return
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            self.signal(signal.SIGKILL)
            self.proc.wait()

    def kill(self) -> None:
        self.signal(signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)

    def status(self, waiting_reason: str | None) -> dict[str, Any]:
        state = self.state
        if "waiting" in state and waiting_reason == "ContainerCreating":
            state = {"waiting": {"reason": "ContainerCreating"}}
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.spec["image"],
            "imageID": "",
            "ready": self.ready,
            "started": self.started if not self.init else None,
            "restartCount": self.restarts,
            "state": state,
            "lastState": self.last_state,
            "containerID": self.container_id,
        }
        return {k: v for k, v in out.items() if v is not None}
