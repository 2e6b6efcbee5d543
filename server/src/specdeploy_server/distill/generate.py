"""The generate step: prompts → the deployment's own endpoint (OpenAI API) → the target's responses.

Completion prompts go to ``/v1/completions``, chats to ``/v1/chat/completions``, so any backend behind an
OpenAI-compatible endpoint serves them. The output directory gets ``samples.jsonl`` (each prompt with the
target's response), ``heldout.jsonl`` (prompts kept out of training, for measuring the trained draft) and
``generate.json`` (the counts). A request that fails is counted and left out; when every request fails the
step fails with the first error.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from specdeploy_server.distill.prompts import Prompt

__all__ = ["GenerateSettings", "GenerateSummary", "generate"]


@dataclass(frozen=True)
class GenerateSettings:
    endpoint: str  # the OpenAI base URL, ending in /v1
    model: str
    max_tokens: int = 256
    temperature: float = 0.0
    seed: int = 0
    concurrency: int = 8
    api_key: str | None = None
    timeout: float = 300.0


@dataclass(frozen=True)
class GenerateSummary:
    prompts: int
    samples: int
    held_out: int
    failed: int
    completion_tokens: int
    seconds: float
    first_error: str | None = None


def _post(settings: GenerateSettings, path: str, body: dict[str, Any]) -> dict[str, Any]:
    headers = {"Content-Type": "application/json"}
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key}"
    url = f"{settings.endpoint.rstrip('/')}{path}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=settings.timeout) as response:
            answer: dict[str, Any] = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        detail = exc.read().decode(errors="replace")[:300]
        raise RuntimeError(f"{path}: HTTP {exc.code}: {detail}") from exc
    return answer


def _one(settings: GenerateSettings, prompt: Prompt, index: int) -> dict[str, Any]:
    common = {
        "model": settings.model,
        "max_tokens": settings.max_tokens,
        "temperature": settings.temperature,
        "seed": settings.seed + index,
    }
    if prompt.messages is None:
        answer = _post(settings, "/completions", {**common, "prompt": prompt.text})
        text = answer["choices"][0]["text"]
    else:
        answer = _post(settings, "/chat/completions", {**common, "messages": list(prompt.messages)})
        text = answer["choices"][0]["message"]["content"] or ""
    usage = answer.get("usage") or {}
    return {
        **prompt.to_json(),
        "completion": text,
        "finishReason": answer["choices"][0].get("finish_reason"),
        "completionTokens": int(usage.get("completion_tokens") or 0),
    }


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def generate(
    settings: GenerateSettings, training: list[Prompt], held_out: list[Prompt], out: Path
) -> GenerateSummary:
    """Ask the endpoint for a response to each training prompt; write the samples, the held-out prompts and
    the summary into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    samples: list[dict[str, Any] | None] = [None] * len(training)
    errors: list[str] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, settings.concurrency)) as pool:
        futures = {pool.submit(_one, settings, prompt, i): i for i, prompt in enumerate(training)}
        for future in concurrent.futures.as_completed(futures):
            try:
                samples[futures[future]] = future.result()
            except Exception as exc:  # one request: counted, the others go on
                errors.append(f"{type(exc).__name__}: {exc}")
    kept = [s for s in samples if s is not None]
    summary = GenerateSummary(
        prompts=len(training) + len(held_out),
        samples=len(kept),
        held_out=len(held_out),
        failed=len(errors),
        completion_tokens=sum(int(s["completionTokens"]) for s in kept),
        seconds=round(time.monotonic() - start, 3),
        first_error=errors[0] if errors else None,
    )
    _write_jsonl(out / "samples.jsonl", kept)
    _write_jsonl(out / "heldout.jsonl", [p.to_json() for p in held_out])
    (out / "generate.json").write_text(json.dumps(asdict(summary), indent=2) + "\n", encoding="utf-8")
    if not kept:
        raise RuntimeError(f"no prompt got a response from {settings.endpoint}: {errors[0]}")
    return summary
