"""Every GPU measurement of the server in one run that fits a short loan of a GPU (about 8 minutes on an
H200), each section writing its record as soon as it is done (a run cut short keeps what it measured):

1. ``reference-1b``: the reference backend on Llama 3.2 1B's shapes with Llama 3's vocabulary (128 256):
   plain decoding, k = 4 and ``draftLen: auto`` at concurrency 1 and 8 (``gpu_reference``);
2. ``assisted``: transformers' assisted generation (draft model, prompt lookup) against ours at batch 1, 1B
   shapes (``assisted``);
3. ``http``: the server over HTTP against the same engine driven directly, streamed tokens/s per stream at
   concurrency 1 and 16, 1B shapes (``gpu_http``);
4. ``structured``: a ``json_schema`` request with speculation on and off, 1B shapes (``structured``);
5. ``reference-8b``: as 1, on Llama 3.1 8B's shapes.

Models are random weights built on the device (``assisted.build_models``): a target whose later layers are
scaled down and a 2-layer layer-skip draft cut from it. Every engine serves for a few seconds before it is
measured (on an H200 an engine's first seconds ran up to 3x slower). The GPU's SM clock and utilisation
are sampled during each section (``gpu_clocks``). ``--smoke`` runs the same code on the CPU with the tiny
shape and short windows, in about a minute (tests/server/test_gpu_day.py).

    python -m benchmarks.server.gpu_day --results benchmarks/results      # on a machine with a GPU
    python -m benchmarks.server.gpu_day --smoke --results /tmp/gpu-smoke  # the same code on the CPU
    python -m benchmarks.server.gpu_day --only http,structured            # a subset (a rerun)

``benchmarks/gpu_day.sh`` wraps it for a machine that lacks the server's dependencies (wheels beside it).
Measured on an H200 (reference-1b 130 s, http 267 s, structured 69 s, reference-8b 205 s before the sizes
below were cut to fit): plan about 8 minutes for the five sections.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from specdeploy_testkit import sample_text

from benchmarks import records
from benchmarks.server import assisted, gpu_http, gpu_reference, structured
from benchmarks.server.gpu_clocks import ClockSampler

SECTIONS = records.GPU_SECTIONS
RECORD_PREFIX = "server-gpu-"


@dataclass(frozen=True)
class Settings:
    """What a run measures with: the GPU's figures, or the CPU smoke run's."""

    device: str
    dtype: str
    vocab: int
    small_shape: str  # sections 1-4
    large_shape: str  # section 5
    window_seconds: float
    warmup_seconds: float  # before an engine's first window in the reference sections
    rounds: int
    max_tokens: int
    engine_warmup_seconds: float  # an engine serves this long before it is measured (sections 2-4)
    http_levels: tuple[int, ...]
    http_requests: int
    http_max_tokens: int
    structured_requests: int
    structured_max_new: int
    assisted_prompts: int
    assisted_max_new: int


GPU = Settings(
    device="cuda",
    dtype="bfloat16",
    vocab=gpu_reference.LLAMA3_VOCAB,
    small_shape="llama-1b",
    large_shape="llama-8b",
    window_seconds=2.5,
    warmup_seconds=2.0,
    rounds=3,
    max_tokens=128,
    engine_warmup_seconds=4.0,
    http_levels=(1, 16),
    http_requests=2,
    http_max_tokens=64,
    structured_requests=3,
    structured_max_new=200,
    assisted_prompts=3,
    assisted_max_new=64,
)
SMOKE = Settings(
    device="cpu",
    dtype="float32",
    vocab=4096,
    small_shape="tiny",
    large_shape="tiny",
    window_seconds=0.3,
    warmup_seconds=0.3,
    rounds=1,
    max_tokens=16,
    engine_warmup_seconds=0.2,
    http_levels=(1, 2),
    http_requests=1,
    http_max_tokens=16,
    structured_requests=2,
    structured_max_new=60,
    assisted_prompts=2,
    assisted_max_new=16,
)
DRAFT_LAYERS = 2
DRAFT_LEN = 4


def machine(settings: Settings) -> dict[str, Any]:
    import transformers  # noqa: PLC0415

    extra = {"torch": torch.__version__, "transformers": transformers.__version__}
    if settings.device == "cuda":
        props = torch.cuda.get_device_properties(0)
        extra |= {
            "gpu": torch.cuda.get_device_name(0),
            "gpu_memory_gib": f"{props.total_memory / 1024**3:.0f}",
            "cuda": str(torch.version.cuda),
        }
    return records.machine_facts(**extra)


def _reference_args(settings: Settings, shape: str) -> argparse.Namespace:
    return gpu_reference.parse(
        [
            *("--device", settings.device, "--shape", shape, "--dtype", settings.dtype),
            *("--vocab", str(settings.vocab), "--draft-layers", str(DRAFT_LAYERS)),
            *("--rounds", str(settings.rounds), "--seconds", str(settings.window_seconds)),
            *("--warmup", str(settings.warmup_seconds), "--max-tokens", str(settings.max_tokens)),
        ]
    )


class Models:
    """The checkpoints of one shape under a temporary directory, built when first asked for."""

    def __init__(self, settings: Settings, shape: str) -> None:
        self.args = _reference_args(settings, shape)
        self._root: Path | None = None
        self._paths: tuple[Path, Path] | None = None

    def paths(self) -> tuple[Path, Path]:
        if self._paths is None:
            self._root = Path(tempfile.mkdtemp(prefix=f"gpu-day-{self.args.shape}-"))
            self._paths = gpu_reference.build(self._root, self.args)
        return self._paths

    def remove(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
        self._root = self._paths = None


def _free_device_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@dataclass(frozen=True)
class Section:
    name: str
    title: str
    run: Callable[[], Sequence[Any]]
    parameters: dict[str, Any]


def sections(settings: Settings, small: Models, large: Models, device_name: str) -> list[Section]:
    def reference(models: Models, before: Callable[[], None] = lambda: None) -> Callable[[], Sequence[Any]]:
        def measure() -> Sequence[Any]:
            before()
            return gpu_reference.run_on(*models.paths(), models.args)

        return measure

    def http() -> Sequence[Any]:
        return gpu_http.run_on(
            *small.paths(),
            device=settings.device,
            dtype=settings.dtype,
            device_name=device_name,
            levels=settings.http_levels,
            k=DRAFT_LEN,
            requests=settings.http_requests,
            max_tokens=settings.http_max_tokens,
            rounds=settings.rounds,
            warmup_seconds=settings.engine_warmup_seconds,
        )

    def constrained() -> Sequence[Any]:
        return structured.run_on(
            *small.paths(),
            requests=settings.structured_requests,
            max_new=settings.structured_max_new,
            k=DRAFT_LEN,
            methods=("none", "draftTarget"),
            device=settings.device,
            dtype=settings.dtype,
            warmup_seconds=settings.engine_warmup_seconds,
        )

    def peer() -> Sequence[Any]:
        target, draft = small.paths()
        texts = sample_text.prompts(settings.assisted_prompts, seed=11)
        hf = assisted.Transformers(target, draft, DRAFT_LEN, device=settings.device, dtype=settings.dtype)
        try:
            return [
                result
                for method in ("none", "draftTarget", "promptLookup")
                for result in assisted.compare(
                    hf,
                    target,
                    draft,
                    method,
                    texts,
                    max_new=settings.assisted_max_new,
                    k=DRAFT_LEN,
                    dtype=settings.dtype,
                    warmup_seconds=settings.engine_warmup_seconds,
                )
            ]
        finally:
            del hf

    common = {"device": settings.device, "dtype": settings.dtype, "vocab": settings.vocab}
    reference_parameters = {
        **common,
        "draft_layers": DRAFT_LAYERS,
        "rounds": settings.rounds,
        "window_seconds": settings.window_seconds,
        "warmup_seconds": settings.warmup_seconds,
        "max_tokens": settings.max_tokens,
        "concurrency": [1, 8],
    }
    small_shape = {
        **common,
        "shape": settings.small_shape,
        "engine_warmup_seconds": settings.engine_warmup_seconds,
    }
    return [
        Section(
            "reference-1b",
            f"Reference backend, {settings.small_shape} shapes: plain, k = 4, auto",
            reference(small),
            {**reference_parameters, "shape": settings.small_shape},
        ),
        Section(
            "assisted",
            f"transformers' assisted generation vs ours at batch 1, {settings.small_shape} shapes",
            peer,
            {
                **small_shape,
                "prompts": settings.assisted_prompts,
                "max_new": settings.assisted_max_new,
                "draft_len": DRAFT_LEN,
            },
        ),
        Section(
            "http",
            f"Server over HTTP vs the engine driven directly, {settings.small_shape} shapes",
            http,
            {
                **small_shape,
                "levels": list(settings.http_levels),
                "draft_len": DRAFT_LEN,
                "requests_per_stream": settings.http_requests,
                "max_tokens": settings.http_max_tokens,
                "rounds": settings.rounds,
            },
        ),
        Section(
            "structured",
            f"JSON schema with speculation on and off, {settings.small_shape} shapes",
            constrained,
            {
                **small_shape,
                "requests": settings.structured_requests,
                "max_new": settings.structured_max_new,
                "draft_len": DRAFT_LEN,
            },
        ),
        Section(
            "reference-8b",
            f"Reference backend, {settings.large_shape} shapes: plain, k = 4, auto",
            reference(large, before=small.remove),  # the large checkpoints need the disk
            {**reference_parameters, "shape": settings.large_shape},
        ),
    ]


def _measure(
    section: Section, command: str, facts: dict[str, Any], sampler: ClockSampler, results: Path
) -> bool:
    """Run one section and write its record; whether it succeeded (a failure is printed, not raised)."""
    from benchmarks.server import render  # noqa: PLC0415

    print(f"== {section.name}: {section.title}", flush=True)
    started = records.now()
    record = records.new_record(
        RECORD_PREFIX + section.name, command, started, dict(facts), section.parameters
    )
    clock = time.perf_counter()
    sampler.start()
    try:
        rows = [dataclasses.asdict(r) for r in section.run()]
    except Exception:
        traceback.print_exc()
        print(f"== {section.name}: FAILED after {time.perf_counter() - clock:.0f} s", flush=True)
        return False
    finally:
        clocks = sampler.stop()
        _free_device_memory()
    records.finish(record, started, {"runs": [rows], "gpu_clock": clocks})
    path = records.save(record, results)
    print(render.gpu_section(record), flush=True)
    print(f"== {section.name}: {time.perf_counter() - clock:.0f} s, wrote {path}", flush=True)
    return True


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.server.gpu_day",
        description=__doc__,
        formatter_class=argparse.RawTextHelpFormatter,
    )
    parser.add_argument("--smoke", action="store_true", help="the tiny shape on the CPU, short windows")
    parser.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    parser.add_argument("--results", type=Path, default=records.RESULTS, help="where the records go")
    parser.add_argument("--vocab", type=int, help="vocabulary size (default: 128 256; --smoke: 4 096)")
    args = parser.parse_args(argv)
    only = [s for s in args.only.split(",") if s]
    unknown = sorted(set(only) - set(SECTIONS))
    if unknown:
        parser.error(f"--only: unknown sections {unknown}; known: {', '.join(SECTIONS)}")
    settings = SMOKE if args.smoke else GPU
    if args.vocab is not None:
        settings = dataclasses.replace(settings, vocab=args.vocab)
    name = gpu_reference.device_name(settings.device)
    command = records.command_line(["python", "-m", "benchmarks.server.gpu_day", *argv])
    facts = machine(settings)
    small, large = Models(settings, settings.small_shape), Models(settings, settings.large_shape)
    failed = []
    sampler = ClockSampler()
    run_started = time.perf_counter()

    try:
        for section in sections(settings, small, large, name):
            if section.name in only and not _measure(section, command, facts, sampler, args.results):
                failed.append(section.name)
    finally:
        small.remove()
        large.remove()
    print(f"all sections: {time.perf_counter() - run_started:.0f} s", flush=True)
    if failed:
        print(f"failed sections: {', '.join(failed)}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
