"""Running README commands as the README shows them (tests/docs/readme_rows.py says which and how)."""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import wait_for
from tests.docs.readme_rows import REPO, readme_command


@dataclass
class Shell:
    """Runs README commands with `bash` in the repository root, in `env`."""

    env: dict[str, str]
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def script(self, command: str, subs: Mapping[str, str], append: str) -> str:
        text = readme_command(command)
        if text.startswith("make "):
            text = "make -o .venv/.installed -o .venv/.runtime " + text.removeprefix("make ")
        for old, new in subs.items():
            assert old in text, f"{old!r} is not in the README command {command!r} any more"
            text = text.replace(old, new)
        return text + append

    def run(
        self,
        command: str,
        subs: Mapping[str, str] | None = None,
        *,
        append: str = "",
        then: str = "",
        check: bool = True,
        timeout: float = 180,
    ) -> subprocess.CompletedProcess[str]:
        script = self.script(command, subs or {}, append)
        with subprocess.Popen(
            ["bash", "-c", f"set -euo pipefail\n{script}\n{then}"],
            cwd=REPO,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        ) as child:
            try:
                stdout, stderr = child.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)  # what the command started too (make, its recipes)
                child.communicate()
                raise
        proc = subprocess.CompletedProcess(child.args, child.returncode, stdout, stderr)
        if check:
            assert proc.returncode == 0, (
                f"`{script}` failed ({proc.returncode}):\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
            )
        return proc

    def start(
        self, command: str, log: Path, subs: Mapping[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        """The command in the background (its own process group), its output in `log`."""
        script = self.script(command, subs or {}, "")
        with log.open("wb") as out:
            proc = subprocess.Popen(
                ["bash", "-c", f"{script}\nwait"],
                cwd=REPO,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.started.append(proc)
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)

    def export(self, command: str, subs: Mapping[str, str]) -> Shell:
        """A shell whose environment is this one after the README's `export` command."""
        out = self.run(command, subs, then="env -0").stdout
        env = dict(item.split("=", 1) for item in out.split("\0") if "=" in item)
        return Shell(env, self.started)

    def tool(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A command that is not the README's (to look at what one did), in the same environment."""
        proc = subprocess.run(
            argv, cwd=REPO, env=self.env, capture_output=True, text=True, timeout=120, check=False
        )
        if check:
            assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}"
        return proc


def make_dry_run(shell: Shell, *args: str) -> list[str]:
    """What `make` would run for `args`, every recipe of every prerequisite included (`-n -B`)."""
    out = shell.tool("make", "--no-print-directory", "-n", "-B", *args).stdout
    return [line.strip() for line in out.splitlines() if line.strip()]


def wait_for_text(path: Path, pattern: str, proc: subprocess.Popen[bytes], timeout: float) -> str:
    """The output in `path` once `pattern` matches a line of it; fails after `timeout` or if `proc` exits."""

    def matched() -> str | None:
        text = path.read_text(errors="replace")
        if re.search(pattern, text, re.MULTILINE):
            return text
        assert proc.poll() is None, f"exited ({proc.returncode}):\n{text[-3000:]}"
        return None

    found: str = wait_for(matched, timeout=timeout, interval=0.3, what=f"{pattern!r} in {path.name}")
    return found


def make_target(command: str) -> list[str]:
    words = shlex.split(command)
    assert words[0] == "make", command
    return words[1:]
