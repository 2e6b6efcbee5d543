"""Safe scale-down: on SIGTERM readiness and new requests are refused at once, in-flight requests finish, a
request still running at ``shutdownTimeoutSeconds`` ends with ``finish_reason: abort``, the process exits 0.

The SIGTERM test runs the real server process. Starting it (importing torch and transformers) takes seconds,
so a module fixture starts it with the first test of this module and the in-process test runs meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai import AsyncStream
from openai.types import Completion
from specdeploy_server.api.app import app_state, create_app
from specdeploy_server.cli import HTTP_BACKSTOP_SECONDS
from specdeploy_testkit import checkpoints
from specdeploy_testkit.checkpoints import TinyLlama

from tests.server.conftest import TinyModels
from tests.server.cpu_engine import MODEL, PROMPT, cpu_engine, load_gauges
from tests.server.livethread import serve_on_loop

SHUTDOWN_TIMEOUT = 3.0  # the server process's serving.shutdownTimeoutSeconds
DRAIN_ABORT = "drain: 1 request(s) unfinished at the {:.1f} s shutdown timeout: aborted"


@dataclass
class ServerProcess:
    """``python -m specdeploy_server --config …`` with its stderr read line by line on a thread."""

    process: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    port: int | None = None
    started: threading.Event = field(default_factory=threading.Event)
    shut_down: threading.Event = field(default_factory=threading.Event)  # "Application shutdown complete"

    def read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line)
            running = re.search(r"Uvicorn running on http://127\.0\.0\.1:(\d+)", line)
            if running:
                self.port = int(running.group(1))
                self.started.set()
            if "Application shutdown complete" in line:
                self.shut_down.set()
        self.started.set()  # the process ended (port stays None if it never served)

    def log(self) -> str:
        return "".join(self.lines)


@pytest.fixture(scope="module")
def long_model(tiny_models: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny target with a 32k context: room for a request that outlasts the shutdown timeout."""
    return checkpoints.save_tiny_llama(
        tmp_path_factory.mktemp("long") / "long",
        tiny_models.tokenizer,
        seed=0,
        shape=TinyLlama(max_position_embeddings=32768),
    )


@pytest.fixture(scope="module", autouse=True)
def server_process(long_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    config = tmp_path_factory.mktemp("server") / "server.json"
    config.write_text(
        json.dumps(
            {
                "model": {"target": str(long_model), "servedModelName": MODEL},
                "speculative": {"method": "none"},
                "placement": {"device": "cpu", "cpuThreads": 1},
                "serving": {"host": "127.0.0.1", "port": 0, "shutdownTimeoutSeconds": SHUTDOWN_TIMEOUT},
            }
        )
    )
    process = subprocess.Popen(
        [sys.executable, "-m", "specdeploy_server", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    handle = ServerProcess(process)
    reader = threading.Thread(target=handle.read, name="server-stderr", daemon=True)
    reader.start()
    try:
        yield handle
    finally:
        if process.poll() is None:
            process.kill()
        process.wait(timeout=30)
        reader.join(timeout=10)


async def _long_and_short_streams(base: str) -> tuple[AsyncStream[Completion], AsyncStream[Completion]]:
    """Two streamed completions in flight, each past its first chunk: one of 30000 tokens, which outlasts any
    shutdown timeout, and one of 40 with usage, which finishes well within one."""
    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    long = await client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=30000, temperature=0, stream=True
    )
    await anext(long)
    short = await client.completions.create(
        model=MODEL,
        prompt=PROMPT,
        max_tokens=40,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    await anext(short)
    return long, short


def test_draining_refuses_new_work_finishes_in_flight_and_aborts_what_is_left(
    long_model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """What SIGTERM does inside the server (AppState.begin_drain), in process: readiness 503 ``draining``,
    new requests 503 ``shutting_down`` with Retry-After, liveness still 200; the in-flight request that can
    finish does; the one that cannot ends at the shutdown timeout with ``finish_reason: abort`` and [DONE]."""
    caplog.set_level(logging.WARNING, logger="specdeploy_server.core.scheduler")
    timeout = 3.0  # the short stream's 40 steps fit in it on a loaded machine; the long one's 30000 do not
    engine = cpu_engine(long_model, None, method="none")
    app = create_app(engine, served_model_name=MODEL, shutdown_timeout=timeout)
    state = app_state(app)

    async def main() -> None:
        async with (
            serve_on_loop(app) as base,
            httpx.AsyncClient(base_url=base, timeout=60) as http,
        ):
            long, short = await _long_and_short_streams(base)
            assert engine.queue_depth == 2  # both in flight

            state.begin_drain()
            ready = await http.get("/health/ready")
            assert (ready.status_code, ready.json()) == (503, {"status": "draining"})
            assert (await http.get("/health/live")).status_code == 200
            refused = await http.post(
                "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 3}
            )
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            assert refused.json()["error"]["code"] == "shutting_down"

            short_rest = [chunk async for chunk in short]  # ends at [DONE]
            long_rest = [chunk async for chunk in long]
            assert state.drain_task is not None
            await state.drain_task

        assert [c.choices[0].finish_reason for c in short_rest if c.choices][-1] == "length"
        assert short_rest[-1].usage is not None
        assert short_rest[-1].usage.completion_tokens == 40
        assert str(long_rest[-1].choices[0].finish_reason) == "abort"  # not in the openai types
        # aborted by the timeout (the loop still ran): the drain says so
        assert DRAIN_ABORT.format(timeout) in caplog.text

    asyncio.run(main())


def test_sigterm_drains_the_server_process_and_exits_zero(server_process: ServerProcess) -> None:
    """The real process: SIGTERM with two streams in flight. The 40-token one completes; the 30000-token one
    is aborted at shutdownTimeoutSeconds; nothing new is accepted after the signal; exit status 0."""
    assert server_process.started.wait(timeout=180), "the server process did not start"
    assert server_process.port is not None, server_process.log()
    base = f"http://127.0.0.1:{server_process.port}"
    with httpx.Client(base_url=base, timeout=30) as http:
        assert http.get("/health/ready").status_code == 200

    async def main() -> tuple[float, list[Any], list[Any], list[int | str], list[int | str]]:
        long, short = await _long_and_short_streams(base)
        async with httpx.AsyncClient(base_url=base, timeout=10) as http:
            in_flight = load_gauges((await http.get("/metrics")).text).depth
        server_process.process.send_signal(signal.SIGTERM)

        # From the signal on, nothing is ready and nothing new is taken: 503 while the listener is still
        # open, connection refused once uvicorn has closed it. A connection caught in between (accepted by
        # the kernel or by uvicorn just as the listener closes) is dropped without a response.
        async def status(method: str, path: str, **kwargs: Any) -> int | str:
            try:
                async with httpx.AsyncClient(base_url=base, timeout=10) as http:
                    response = await http.request(method, path, **kwargs)
            except httpx.ConnectError:
                return "refused"
            except (httpx.ReadError, httpx.RemoteProtocolError):
                return "dropped"
            if response.status_code == 503 and path == "/health/ready":
                assert response.json() == {"status": "draining"}
            elif response.status_code == 503:
                assert response.headers.get("retry-after") == "1"
                assert response.json()["error"]["code"] == "shutting_down"
            return response.status_code

        readiness, new = [], []
        for _ in range(3):
            readiness.append(await status("GET", "/health/ready"))
            new.append(
                await status(
                    "POST", "/v1/completions", json={"model": MODEL, "prompt": PROMPT, "max_tokens": 2}
                )
            )
        short_rest = [chunk async for chunk in short]
        long_rest = [chunk async for chunk in long]
        return in_flight, short_rest, long_rest, readiness, new

    in_flight, short_rest, long_rest, readiness, new = asyncio.run(main())
    returncode = server_process.process.wait(timeout=60)
    assert server_process.shut_down.wait(timeout=10)
    log = server_process.log()

    assert set(readiness) <= {503, "refused", "dropped"}, readiness
    assert set(new) <= {503, "refused", "dropped"}, new
    # both requests were in flight just before the signal (the short one still had 39 tokens, dozens of
    # steps, to go); the short one completed in full
    assert in_flight == 2
    finish = [c.choices[0].finish_reason for c in short_rest if c.choices]
    assert finish[-1] == "length"
    assert short_rest[-1].usage is not None
    assert short_rest[-1].usage.completion_tokens == 40
    # the long one was cut off at the shutdown timeout, still with a proper end of stream
    assert long_rest[-1].choices[0].finish_reason == "abort"
    assert returncode == 0, log
    # The engine's drain ended the long stream at shutdownTimeoutSeconds, not uvicorn's backstop (which
    # would have cut the connections ceil(timeout) + HTTP_BACKSTOP_SECONDS after the signal).
    assert DRAIN_ABORT.format(SHUTDOWN_TIMEOUT) in log
    assert "timeout graceful shutdown exceeded" not in log, f"backstop {HTTP_BACKSTOP_SECONDS} s:\n{log}"
