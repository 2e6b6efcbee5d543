"""`python -m specdeploy_operator` as a child process: the real operator, killable and restartable, with its
liveness and metrics endpoints. Used by the integration tests and the operator benchmark."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from specdeploy_localcluster.processes import (
    PortTaken,
    free_port,
    output_since,
    port_taken,
    retry_on_taken_port,
)

__all__ = ["OperatorProcess"]


class OperatorProcess:
    """One operator process at a time; `start` waits for its liveness endpoint. Its health and metrics
    ports are chosen free; when one is taken before the operator binds it, `start` starts it again on
    other ports (`health_port` and `metrics_port` say which it has)."""

    def __init__(
        self,
        kubeconfig: Path,
        log_dir: Path,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        log_name: str = "operator.log",
    ) -> None:
        self.kubeconfig = kubeconfig
        self.log = log_dir / log_name
        self.env = {**os.environ, **(env or {})}
        self.args = list(args)
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self, timeout: float = 60.0) -> None:
        if self.proc is not None and self.proc.poll() is None:
            raise RuntimeError("the operator is already running")
        self.starts += 1
        retry_on_taken_port(lambda: self._launch(timeout), undo=self._choose_other_ports)

    def _choose_other_ports(self) -> None:
        self.stop()
        self.health_port = free_port()
        self.metrics_port = free_port()

    def _launch(self, timeout: float) -> None:
        with self.log.open("ab") as log:
            log.write(f"--- start {self.starts} ---\n".encode())
            since = log.tell()
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "specdeploy_operator",
                    f"--kubeconfig={self.kubeconfig}",
                    f"--health-port={self.health_port}",
                    f"--metrics-port={self.metrics_port}",
                    *self.args,
                ],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while True:
            exited = not self.running  # then its output is complete
            # Whether or not it exited: kopf keeps running when its liveness port was taken.
            if port_taken(output_since(self.log, since)):
                raise PortTaken(f"the operator could not bind its ports\n{self.log_tail()}")
            if exited:
                raise RuntimeError(f"the operator exited:\n{self.log_tail()}")
            if self._answers_healthz():
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the operator's liveness endpoint did not answer:\n{self.log_tail()}")
            time.sleep(0.2)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def healthy(self) -> bool:
        """Whether /healthz answers 200; raises if the process exited."""
        if not self.running:
            raise RuntimeError(f"the operator exited:\n{self.log_tail()}")
        return self._answers_healthz()

    def _answers_healthz(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait_exit(self, timeout: float) -> int | None:
        """The exit code once the process has exited by itself (a failpoint), or None after `timeout`."""
        if self.proc is None:
            return None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def kill(self) -> None:
        """SIGKILL: no cleanup, as when a node dies."""
        if self.proc is not None and self.running:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.running:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def metrics(self) -> dict[str, float]:
        """Prometheus samples `name{labels}` -> value."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                samples[name] = float(value)
        return samples

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""
