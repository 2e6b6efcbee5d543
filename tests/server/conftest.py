"""Fixtures for the server tests: tiny Llama checkpoints built once per session, and live uvicorn servers."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
import uvicorn
from fastapi import FastAPI
from specdeploy_server import testing
from specdeploy_server.testing import TinyLlama

# Tiny models run fastest single-threaded; two threads on two cores mostly contend.
torch.set_num_threads(1)


@dataclass(frozen=True)
class TinyModels:
    tokenizer: Path
    target: Path
    draft_same: Path  # byte-identical copy of the target
    draft_unrelated: Path  # same vocabulary, different random weights and shape


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> TinyModels:
    root = tmp_path_factory.mktemp("models")
    tokenizer = root / "tokenizer"
    tokenizer.mkdir()
    testing.train_tokenizer(tokenizer)
    target = testing.save_tiny_llama(root / "target", tokenizer, seed=0)
    same = root / "draft-same"
    shutil.copytree(target, same)
    unrelated = testing.save_tiny_llama(
        root / "draft-unrelated",
        tokenizer,
        seed=1,
        shape=TinyLlama(hidden_size=32, layers=1, heads=2, kv_heads=1),
    )
    return TinyModels(tokenizer, target, same, unrelated)


@dataclass
class LiveServer:
    base_url: str
    server: uvicorn.Server
    thread: threading.Thread
    app: FastAPI


@contextmanager
def run_live(app: FastAPI, graceful_seconds: int = 5) -> Iterator[LiveServer]:
    """Serve ``app`` with uvicorn on 127.0.0.1 (a free port) in a thread."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=graceful_seconds
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.01)
    live = LiveServer(f"http://127.0.0.1:{port}", server, thread, app)
    try:
        yield live
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@pytest.fixture
def live_server() -> Callable[..., object]:
    return run_live
