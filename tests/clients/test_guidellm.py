"""guidellm's ``run`` (its CLI, as a benchmark is run) against the live server: 30 s at a constant rate of
synthetic requests whose output lengths vary, streamed on /v1/completions. guidellm asks for each length with
``max_tokens`` and ``ignore_eos``, so every request's output is exactly as long as asked; its report says so
request by request. Its tokenizer (for the synthetic prompts) is the served model's, from disk."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.clients.conftest import MODEL, ClientServer

SECONDS = 30
RATE = 2  # requests per second


def _option(config: dict[str, Any]) -> str:
    return json.dumps(config)


def test_a_constant_rate_run_gets_exactly_the_requested_output_lengths(
    client_server: ClientServer, tmp_path: Path
) -> None:
    report = tmp_path / "report.json"
    command = [
        str(Path(sys.executable).with_name("guidellm")),
        "run",
        "--backend",
        _option(
            {
                "kind": "openai_http",
                "target": client_server.base_url,
                "model": MODEL,
                "request_format": "/v1/completions",
            }
        ),
        "--profile",
        _option({"kind": "constant", "rate": RATE}),
        "--constraint",
        _option({"kind": "max_duration", "seconds": SECONDS}),
        "--data",
        _option(
            {
                "kind": "synthetic_text",
                "prompt_tokens": 24,
                "output_tokens": 12,
                "output_tokens_stdev": 6,
                "output_tokens_min": 2,
                "output_tokens_max": 24,
            }
        ),
        "--tokenizer",
        _option({"kind": "huggingface_auto", "model": str(client_server.tokenizer)}),
        "--output",
        _option({"kind": "json", "path": str(report)}),
        "--disable-console-interactive",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    run = subprocess.run(
        command, check=False, capture_output=True, text=True, timeout=SECONDS + 240, env=env, cwd=tmp_path
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    data = json.loads(report.read_text(encoding="utf-8"))
    [benchmark] = data["benchmarks"]
    requests = benchmark["requests"]
    assert requests["errored"] == []
    # only the request in flight when the 30 s ran out is left, cancelled
    assert all(r["info"]["status"] == "cancelled" for r in requests["incomplete"])
    done = requests["successful"]
    # a constant rate for the whole run: (nearly) every scheduled request completed
    assert len(done) >= RATE * SECONDS * 0.8
    asked = [json.loads(r["request_args"])["body"] for r in done]
    assert all(body["ignore_eos"] is True for body in asked)
    lengths = [body["max_tokens"] for body in asked]
    assert len(set(lengths)) > 5  # the lengths asked for vary
    # every request's output is exactly as long as it asked (guidellm counts it from the server's usage)
    assert [r["output_tokens"] for r in done] == lengths
    assert all(r["prompt_tokens"] > 0 for r in done)
