"""The server under test in the campaign: the real ``specdeploy-server`` command in its own process (so its
memory and descriptors are its own), on the reference backend with tiny random-weight Llama checkpoints made
on the spot (target + a smaller draft, speculative decoding on), on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
from specdeploy_localcluster.processes import PortTaken, free_port, port_taken, retry_on_taken_port

REPO = Path(__file__).resolve().parents[2]
MODEL = "tiny"


@dataclass(frozen=True)
class ServerSettings:
    max_batch_size: int = 8
    max_queue_size: int = 32
    max_request_body_bytes: int = 1 << 20
    max_model_len: int = 128

    def flags(self) -> list[str]:
        return [
            "--max-batch-size", str(self.max_batch_size), "--max-queue-size", str(self.max_queue_size),
            "--max-request-body-bytes", str(self.max_request_body_bytes),
            "--max-model-len", str(self.max_model_len),
        ]  # fmt: skip


@dataclass(frozen=True)
class Served:
    base_url: str
    pid: int
    model: str
    log: Path


def make_models(root: Path) -> tuple[Path, Path]:
    from specdeploy_testkit import checkpoints  # noqa: PLC0415 (torch)

    tokenizer = root / "tokenizer"
    tokenizer.mkdir(parents=True, exist_ok=True)
    checkpoints.train_tokenizer(tokenizer)
    target = checkpoints.save_tiny_llama(root / "target", tokenizer, seed=0)
    small = checkpoints.TinyLlama(hidden_size=32, layers=1, heads=2, kv_heads=1)
    draft = checkpoints.save_tiny_llama(root / "draft", tokenizer, seed=1, shape=small)
    return target, draft


@contextmanager
def served(work: Path, settings: ServerSettings) -> Iterator[Served]:
    target, draft = make_models(work / "models")
    log = work / "server.log"
    path = f"{REPO / 'server' / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    env = {**os.environ, "PYTHONPATH": path}

    def start() -> tuple[subprocess.Popen[bytes], str]:
        """The server on a free port, ready (on another port if that one was taken before it bound it)."""
        port = free_port()
        command = [
            sys.executable, "-m", "specdeploy_server", str(target), str(draft), "--host", "127.0.0.1",
            "--port", str(port), "--served-model-name", MODEL, "--device", "cpu", "--cpu-threads", "1",
            "--draft-len", "3", *settings.flags(),
        ]  # fmt: skip
        with log.open("w") as out:
            process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        base_url = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(base_url, process, timeout=120)
        except RuntimeError:
            _stop(process)
            if port_taken(log.read_text(errors="replace")):
                raise PortTaken(f"port {port} was taken") from None
            raise
        return process, base_url

    process, base_url = retry_on_taken_port(start)
    try:
        yield Served(base_url, process.pid, MODEL, log)
    finally:
        _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _wait_ready(base_url: str, process: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode} before it was ready")
        try:
            if httpx.get(f"{base_url}/health/ready", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"the server was not ready within {timeout:.0f} s")


def log_problems(log: Path) -> list[str]:
    """Lines of the server's log at ERROR level or with a traceback."""
    lines = log.read_text(errors="replace").splitlines()
    return [line for line in lines if " ERROR " in line or "Traceback" in line]
