"""What only a GPU with TensorRT-LLM can settle about our drafter inside its PyTorch flow
(server/src/specdeploy_server/backends/llmapi_drafter.py), on a random-weight Llama
(``assisted.build_models``, bfloat16, built on the device; no network):

1. greedy identity: the same prompts through ``LLM`` plain and with
   ``UserProvidedDecodingConfig(drafter=ours)`` (prompt lookup, then each prompt's plain output given as
   its prediction) give the same tokens;
2. tokens per step with predictions (streamed responses per request vs. plain), and the accepted counts our
   drafter saw;
3. the cost of our Python drafter per iteration (``prepare_draft_tokens`` timed inside the executor) against
   the iteration time;
4. that the drafter object we passed is the one that ran (single process), so predictions reach it;
5. that ``LLM.get_stats()`` with ``enable_iter_perf_stats`` gives the iteration fields our measured pass costs
   read (``backends/llmapi_step_costs.py``), and the target pass costs they make by size.

Runs with ``TLLM_WORKER_USE_SINGLE_PROCESS=1`` (predictions need it). Prints one JSON line per point and
exits 1 when greedy identity fails; without ``tensorrt_llm`` it says so and exits 0 (nothing to check).

    python -m benchmarks.server.gpu_llmapi_drafter [--max-draft-len 4] [--tokens 96]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

PROMPTS = [
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "SELECT name, age FROM users WHERE age > 30 ORDER BY name; SELECT name, age FROM",
    "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16",
]


def _report(point: str, **values: Any) -> None:
    print(json.dumps({"point": point, **values}), flush=True)


async def _generate(llm: Any, sampling: Any, prompts: list[list[int]]) -> list[tuple[list[int], int]]:
    """(tokens, streamed responses) per prompt, all submitted together."""

    async def one(ids: list[int]) -> tuple[list[int], int]:
        responses, tokens = 0, []
        async for out in llm.generate_async(ids, sampling_params=sampling, streaming=True):
            responses += 1
            tokens = list(out.outputs[0].token_ids)
        return tokens, responses

    return list(await asyncio.gather(*(one(p) for p in prompts)))


def _report_iteration_stats(case: str, stats: list[Any], max_draft_len: int) -> None:
    """Point 5: the fields of the iteration statistics, and the target pass costs our collector makes."""
    from specdeploy_server.backends.llmapi_step_costs import (  # noqa: PLC0415
        StepCostCollector,
        WidthRule,
        parse_iteration,
    )

    collector = StepCostCollector("gpu", WidthRule(max_draft_len))
    parsed = [it for it in map(parse_iteration, stats) if it is not None]
    for iteration in parsed:
        collector.observe(iteration)
    first = json.loads(stats[0]) if stats and isinstance(stats[0], str) else (stats[0] if stats else {})
    _report(
        f"{case}-iteration-stats",
        entries=len(stats),
        parsed=len(parsed),
        fields=sorted(first),
        spec_fields=sorted(first.get("specDecodingStats") or {}),
        target_pass_ms={size: 1000 * s / c for size, (c, s) in sorted(collector.target.items())},
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-draft-len", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=96)
    args = parser.parse_args(argv)
    os.environ["TLLM_WORKER_USE_SINGLE_PROCESS"] = "1"
    if importlib.util.find_spec("tensorrt_llm") is None:
        _report("skipped", reason="tensorrt_llm is not installed")
        return 0
    tensorrt_llm: Any = importlib.import_module("tensorrt_llm")
    from specdeploy_server.backends.llmapi_drafter import drafter_class, request_hints  # noqa: PLC0415
    from specdeploy_server.core.types import RequestSpeculation  # noqa: PLC0415

    llmapi: Any = importlib.import_module("tensorrt_llm.llmapi")
    from transformers import AutoTokenizer  # noqa: PLC0415

    from benchmarks.server.assisted import build_models  # noqa: PLC0415

    _report("version", tensorrt_llm=str(tensorrt_llm.__version__))
    if not hasattr(llmapi, "UserProvidedDecodingConfig"):
        _report("skipped", reason="this TensorRT-LLM has no UserProvidedDecodingConfig")
        return 0
    root = Path(tempfile.mkdtemp(prefix="gpu-llmapi-drafter-"))
    target, _ = build_models(root, dtype="bfloat16", device="cuda")
    tokenizer: Any = AutoTokenizer.from_pretrained(target)
    prompts = [list(tokenizer(p)["input_ids"]) for p in PROMPTS]
    sampling = llmapi.SamplingParams(max_tokens=args.tokens, top_k=1, detokenize=False)
    common: dict[str, Any] = {"model": str(target), "max_batch_size": 8, "disable_overlap_scheduler": True}

    plain_llm = tensorrt_llm.LLM(**common)
    plain = asyncio.run(_generate(plain_llm, sampling, prompts))
    plain_llm.shutdown()

    cls: Any = drafter_class()
    timings: list[float] = []
    original = cls.prepare_draft_tokens

    def timed(self: Any, scheduled: Any, resource_manager: Any = None) -> None:
        start = time.perf_counter()
        original(self, scheduled, resource_manager)
        timings.append(time.perf_counter() - start)

    cls.prepare_draft_tokens = timed
    failed = False
    for case in ("prompt-lookup", "prediction"):
        hints = request_hints(f"gpu-{case}")
        drafter = cls(max_draft_len=args.max_draft_len, prompt_lookup_ngram=2, hints=hints)
        spec = llmapi.UserProvidedDecodingConfig(max_draft_len=args.max_draft_len, drafter=drafter)
        llm = tensorrt_llm.LLM(**common, speculative_config=spec, enable_iter_perf_stats=True)
        timings.clear()
        started = time.perf_counter()
        if case == "prediction":
            # ids are assigned at submission: register after it, as the server does
            outputs = asyncio.run(
                _with_predictions(llm, sampling, prompts, plain=plain, hints=hints, spec=RequestSpeculation)
            )
        else:
            outputs = asyncio.run(_generate(llm, sampling, prompts))
        seconds = time.perf_counter() - started
        _report_iteration_stats(case, list(llm.get_stats(timeout=2)), args.max_draft_len)
        llm.shutdown()
        identical = [o[0] == p[0] for o, p in zip(outputs, plain, strict=True)]
        failed |= not all(identical)
        _report(
            case,
            identical=identical,
            responses=[o[1] for o in outputs],
            plain_responses=[p[1] for p in plain],
            drafted=drafter.drafted,
            accepted=drafter.accepted,
            prediction_accepted=drafter.prediction_accepted,
            drafter_calls=len(timings),
            drafter_ms_median=1000 * statistics.median(timings) if timings else None,
            iteration_ms_mean=1000 * seconds / max(len(timings), 1),
            drafter_object_ran=drafter.drafted > 0,  # the object we passed, not a copy
        )
    return 1 if failed else 0


async def _with_predictions(
    llm: Any,
    sampling: Any,
    prompts: list[list[int]],
    *,
    plain: list[tuple[list[int], int]],
    hints: Any,
    spec: Any,
) -> list[tuple[list[int], int]]:
    async def one(ids: list[int], prediction: list[int]) -> tuple[list[int], int]:
        stream = llm.generate_async(ids, sampling_params=sampling, streaming=True)
        hints.register(int(stream.request_id), spec(tuple(prediction)))
        responses, tokens = 0, []
        async for out in stream:
            responses += 1
            tokens = list(out.outputs[0].token_ids)
        hints.drop(int(stream.request_id))
        return tokens, responses

    return list(await asyncio.gather(*(one(p, out[0]) for p, out in zip(prompts, plain, strict=True))))


if __name__ == "__main__":
    sys.exit(main())
