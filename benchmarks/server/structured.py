"""Benchmark 6: constrained (JSON schema) generation with speculation vs without, reference backend on CPU.

The models of benchmark 2 (a random Llama whose later layers refine the first, and a "layer-skip" draft made
of its first layer), greedy, one request at a time. Each request asks for one of the generated schemas of the
tests (``specdeploy_testkit.json_schemas``); the same requests run unconstrained for comparison.
Speculation under a grammar: draft tokens the grammar forbids are cut before verification (counted as drafted
and rejected), and tokens the grammar forces are emitted without a model step (``forced``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdeploy_server.backends.factory import build_engine
from specdeploy_server.config import ServerConfig
from specdeploy_server.core.types import SamplingParams
from specdeploy_server.engine import EngineClient
from specdeploy_server.grammar import GrammarCompiler
from specdeploy_server.tokenizer import HFTokenizer
from specdeploy_testkit.json_schemas import json_schemas

from benchmarks.server.assisted import build_models

PROMPT = "Answer with a JSON object: "


@dataclass(frozen=True)
class StructuredResult:
    method: str
    constrained: bool
    tok_s: float
    tokens_per_target_step: float
    acceptance: float | None
    forced_share: float
    identical: bool
    valid: int
    requests: int


async def warm_up(engine: EngineClient, prompt: list[int], seconds: float) -> None:
    """Short requests until ``seconds`` have passed, at least one: first-call allocations, and on a GPU the
    engine's first seconds, which run slower."""
    started = time.perf_counter()
    while True:
        gen = engine.generate(prompt, 16, SamplingParams(temperature=0.0))
        _ = [out async for out in gen.outputs]
        if time.perf_counter() - started >= seconds:
            return


def _config(target: Path, draft: Path, method: str, k: int, *, device: str, dtype: str) -> dict[str, Any]:
    model: dict[str, Any] = {"target": str(target), "dtype": dtype}
    if method == "draftTarget":
        model["draft"] = str(draft)
    speculative: dict[str, Any] = {"method": method}
    if method != "none":
        speculative["draftLen"] = k
    placement: dict[str, Any] = {"device": device}
    if device == "cpu":
        placement["cpuThreads"] = 1
    return {"model": model, "speculative": speculative, "placement": placement}


async def _one_config(
    engine: EngineClient, schemas: list[dict[str, Any]], max_new: int, constrained: bool
) -> tuple[float, list[list[int]], int]:
    tokenizer = engine.tokenizer
    assert isinstance(tokenizer, HFTokenizer)
    compiler = GrammarCompiler(tokenizer.hf, engine.info.vocab_size or 0, tokenizer.eos_token_ids)
    grammars = [GrammarCompiler.from_json_schema(s) for s in schemas]
    prompt = tokenizer.encode(PROMPT)
    outputs: list[list[int]] = []
    seconds = 0.0
    for grammar in grammars:
        constraint = compiler.compile(grammar) if constrained else None
        started = time.perf_counter()
        gen = engine.generate(prompt, max_new, SamplingParams(temperature=0.0), constraint)
        outputs.append([t async for out in gen.outputs for t in out.token_ids])
        seconds += time.perf_counter() - started
    valid = 0
    if constrained:
        import json  # noqa: PLC0415

        import jsonschema  # noqa: PLC0415

        for schema, tokens in zip(schemas, outputs, strict=True):
            try:
                jsonschema.validate(json.loads(tokenizer.decode(tokens)), schema)
                valid += 1
            except (ValueError, jsonschema.ValidationError):
                pass
    return seconds, outputs, valid


METHODS = ("none", "draftTarget", "promptLookup")


def run(requests: int = 12, max_new: int = 200, k: int = 4) -> list[StructuredResult]:
    with tempfile.TemporaryDirectory() as tmp:
        return run_on(*build_models(Path(tmp)), requests=requests, max_new=max_new, k=k)


def run_on(
    target: Path,
    draft: Path,
    *,
    requests: int,
    max_new: int,
    k: int,
    methods: tuple[str, ...] = METHODS,
    device: str = "cpu",
    dtype: str = "float32",
    warmup_seconds: float = 0.0,
) -> list[StructuredResult]:
    """Every method of ``methods`` (the first is the baseline of the "= method none" column), free and under
    a JSON schema, on the models ``target`` and ``draft``; each engine serves short requests for
    ``warmup_seconds`` (at least one) before it is measured."""
    schemas = json_schemas(requests, seed=6)
    results: list[StructuredResult] = []
    baseline: dict[bool, list[list[int]]] = {}

    async def measure(config: dict[str, Any], constrained: bool) -> tuple[float, list[list[int]], int, Any]:
        engine = build_engine(ServerConfig.model_validate(config))
        await engine.start()
        await warm_up(engine, engine.tokenizer.encode(PROMPT), warmup_seconds)
        before = dataclasses.replace(engine.stats)
        seconds, outputs, valid = await _one_config(engine, schemas, max_new, constrained)
        stats = engine.stats
        await engine.stop(5)
        return seconds, outputs, valid, stats.since(before)

    for method in methods:
        for constrained in (False, True):
            config = _config(target, draft, method, k, device=device, dtype=dtype)
            seconds, outputs, valid, stats = asyncio.run(measure(config, constrained))
            baseline.setdefault(constrained, outputs)
            emitted = sum(len(o) for o in outputs)
            forced = stats.forced
            results.append(
                StructuredResult(
                    method=method,
                    constrained=constrained,
                    tok_s=emitted / seconds,
                    tokens_per_target_step=(emitted - forced) / max(stats.sequence_steps, 1),
                    acceptance=stats.accepted / stats.drafted if stats.drafted else None,
                    forced_share=forced / emitted if emitted else 0.0,
                    identical=outputs == baseline[constrained],
                    valid=valid,
                    requests=requests,
                )
            )
    return results


def table(results: list[StructuredResult]) -> str:
    lines = [
        "| method | output | tok/s | tokens per target step | acceptance | forced tokens | = method none "
        "| valid JSON |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        acc = f"{r.acceptance:.2f}" if r.acceptance is not None else "n/a"
        valid = f"{r.valid}/{r.requests}" if r.constrained else "n/a"
        lines.append(
            f"| {r.method} | {'json_schema' if r.constrained else 'free'} | {r.tok_s:.0f} | "
            f"{r.tokens_per_target_step:.2f} | {acc} | {r.forced_share:.0%} | "
            f"{'yes' if r.identical else 'NO'} | {valid} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(run()))
