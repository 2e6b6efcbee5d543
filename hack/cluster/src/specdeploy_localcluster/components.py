"""The processes of one local cluster, by component name: each started in its own session with its log under
`logs/` and its pid (with its start time, so that a recycled pid is never taken for it) and command line
under `pids/`; found running again from those files by any later process (`down`). The
standard library only."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from specdeploy_localcluster.processes import (
    PortTaken,
    output_since,
    pid_alive,
    pid_start_time,
    port_taken,
    stop_groups,
)

log = logging.getLogger("localcluster")


class ClusterError(RuntimeError):
    """The local cluster could not be started, reached or stopped."""


class ComponentProcesses:
    """The component processes of the cluster in `directory` (run with it as their working directory)."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.logs = directory / "logs"
        self.pids = directory / "pids"
        # Where each log stood when this process last started its component: what a component said since.
        self._log_starts: dict[str, int] = {}

    def running(self, names: Iterable[str]) -> dict[str, int]:
        """The pid of each of `names` that runs now (the process its pid file names, not a recycled pid)."""
        found: dict[str, int] = {}
        for name in names:
            try:
                pid_text, started = (self.pids / f"{name}.pid").read_text().split(":", 1)
                pid = int(pid_text)
            except (OSError, ValueError):
                continue
            if pid_alive(pid) and pid_start_time(pid) == started.strip():
                found[name] = pid
        return found

    def start(self, name: str, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        """Start `name` in its own session (it outlives `make cluster-up`), appending to its log."""
        self.logs.mkdir(parents=True, exist_ok=True)
        self.pids.mkdir(parents=True, exist_ok=True)
        with (self.logs / f"{name}.log").open("ab") as out:
            self._log_starts[name] = out.tell()
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env={**os.environ, **(env or {})},
                cwd=self.dir,
            )
        (self.pids / f"{name}.pid").write_text(f"{proc.pid}:{pid_start_time(proc.pid)}")
        (self.pids / f"{name}.argv.json").write_text(json.dumps({"argv": argv, "env": dict(env or {})}))
        log.info("started %s pid=%d", name, proc.pid)

    def restart(self, name: str) -> None:
        """Start a stopped component again with the command line and environment it had."""
        saved = json.loads((self.pids / f"{name}.argv.json").read_text())
        self.start(name, saved["argv"], saved["env"])

    def stop(self, name: str, timeout: float) -> None:
        """SIGTERM `name`'s process group, SIGKILL after `timeout`."""
        pid = self.running([name]).get(name)
        if pid is None:
            raise ClusterError(f"{name} is not running")
        stop_groups([pid], timeout)

    def stop_waves(self, waves: Iterable[Iterable[str]], timeout: float) -> list[str]:
        """Stop the running components wave by wave, each wave gone before the next; returns those stopped."""
        stopped: list[str] = []
        for wave in waves:
            running = self.running(wave)
            stop_groups(list(running.values()), timeout)
            stopped += running
        return stopped

    def stop_client(self, name: str, timeout: float = 15.0) -> None:
        """Stop a process that someone else started against this cluster and recorded as `pids/<name>` (its
        pid, the leader of its own session), if it still runs."""
        try:
            pid = int((self.pids / name).read_text().split(":")[0])
        except (OSError, ValueError):
            return
        if pid_alive(pid):
            stop_groups([pid], timeout)

    def log_tail(self, name: str, lines: int = 25) -> str:
        try:
            return "\n".join((self.logs / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def raise_if_port_taken(self) -> None:
        """Raise `PortTaken` if a component this object started said, since, that its port was taken (a
        component that failed for want of another's port fails differently: it is the cause)."""
        for name, offset in self._log_starts.items():
            if port_taken(output_since(self.logs / f"{name}.log", offset)):
                raise PortTaken(f"{name} could not bind its port\nlast log lines:\n{self.log_tail(name)}")

    def expect_alive(self, name: str) -> None:
        """Raise if `name` exited: `PortTaken` when a port was taken, else `ClusterError`."""
        if name in self.running([name]):
            return
        self.raise_if_port_taken()
        raise ClusterError(f"{name} exited during start-up; last log lines:\n{self.log_tail(name)}")

    def wait(self, check: Callable[[], bool], deadline: float, component: str, what: str) -> None:
        """Poll `check` until it holds, while `component` runs, until `deadline` (time.monotonic())."""
        while time.monotonic() < deadline:
            self.expect_alive(component)
            if check():
                return
            time.sleep(0.2)
        raise ClusterError(f"timed out waiting for {what}; last log lines:\n{self.log_tail(component)}")
