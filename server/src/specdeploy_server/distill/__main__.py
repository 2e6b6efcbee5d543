"""``specdeploy-distill``: the steps that make a draft from the target's own outputs.

    specdeploy-distill generate --prompts PATH --endpoint URL --model NAME --out DIR [--samples N]
        [--held-out N] [--max-tokens N] [--temperature T] [--seed N] [--concurrency N]
    specdeploy-distill train-eagle3 --target DIR --samples FILE --out DIR [TRAINING]
    specdeploy-distill train-draft --target DIR --draft DIR --samples FILE --out DIR [TRAINING]

TRAINING: [--steps N] [--batch-size N] [--max-seconds S] [--learning-rate LR] [--max-length N] [--seed N]
[--threads N].

Each prints its summary as one JSON line, and writes it as the container's termination message
(`/dev/termination-log` where the container runtime made one, or `$SPECDEPLOY_TERMINATION_LOG`): the operator
reads a DraftTraining's figures there. Bad input exits with status 2 and one line naming what is wrong; an
endpoint that answers no prompt, with status 1 and its first error.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from specdeploy_server.distill.generate import GenerateSettings, generate
from specdeploy_server.distill.prompts import DistillError, read_prompts, split


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive number")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdeploy-distill", description=__doc__.split("\n\n")[0])
    steps = parser.add_subparsers(dest="step", required=True)
    gen = steps.add_parser("generate", help="prompts -> the deployment's endpoint -> the target's responses")
    gen.add_argument("--prompts", type=Path, required=True, help="a .jsonl/.txt file or a directory of them")
    gen.add_argument("--endpoint", required=True, help="OpenAI base URL, e.g. http://NAME.NS.svc:8000/v1")
    gen.add_argument("--model", required=True, help="the served model name")
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--samples", type=_positive, default=1000, help="training prompts to answer")
    gen.add_argument("--held-out", type=int, default=0, help="prompts kept out of training")
    gen.add_argument("--max-tokens", type=_positive, default=256)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--concurrency", type=_positive, default=8)
    eagle = steps.add_parser("train-eagle3", help="an EAGLE-3 head trained by ModelOpt on the samples")
    draft = steps.add_parser("train-draft", help="the draft model distilled on the samples")
    draft.add_argument("--draft", type=Path, required=True, help="the draft checkpoint to start from")
    for train, batch, rate in ((eagle, 4, 1e-3), (draft, 8, 1e-4)):
        train.add_argument("--target", type=Path, required=True, help="the target checkpoint directory")
        train.add_argument("--samples", type=Path, required=True, help="the generate step's samples.jsonl")
        train.add_argument("--out", type=Path, required=True)
        train.add_argument("--steps", type=int, default=200)
        train.add_argument("--batch-size", type=_positive, default=batch)
        train.add_argument("--max-seconds", type=float, default=3600.0)
        train.add_argument("--learning-rate", type=float, default=rate)
        train.add_argument("--max-length", type=_positive, default=1024)
        train.add_argument("--seed", type=int, default=0)
        train.add_argument("--threads", type=_positive, default=None)
    return parser


def _train(args: argparse.Namespace) -> object:
    from specdeploy_server.distill.samples import TrainSettings  # noqa: PLC0415 (torch)

    settings = TrainSettings(
        steps=args.steps,
        batch_size=args.batch_size,
        max_seconds=args.max_seconds,
        learning_rate=args.learning_rate,
        max_length=args.max_length,
        seed=args.seed,
        threads=args.threads,
    )
    if args.step == "train-eagle3":
        from specdeploy_server.distill.eagle3_train import train_eagle3  # noqa: PLC0415

        return train_eagle3(args.target, args.samples, args.out, settings)
    from specdeploy_server.distill.draft_train import train_draft  # noqa: PLC0415

    return train_draft(args.target, args.draft, args.samples, args.out, settings)


def _terminate_with(line: str) -> None:
    """Write `line` as the termination message when there is a place for one (never creates /dev files)."""
    path = os.environ.get("SPECDEPLOY_TERMINATION_LOG") or "/dev/termination-log"
    if not os.path.exists(path):
        return
    try:
        with open(path, "w", encoding="utf-8") as out:
            out.write(line + "\n")
    except OSError:
        pass


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.step == "generate":
            if args.held_out < 0:
                raise DistillError(f"--held-out {args.held_out} is negative")
            training, held_out = split(read_prompts(args.prompts), args.samples, args.held_out, args.seed)
            settings = GenerateSettings(
                endpoint=args.endpoint,
                model=args.model,
                max_tokens=args.max_tokens,
                temperature=args.temperature,
                seed=args.seed,
                concurrency=args.concurrency,
            )
            summary: object = generate(settings, training, held_out, args.out)
        else:
            summary = _train(args)
    except DistillError as exc:
        print(f"specdeploy-distill {args.step}: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:  # the endpoint answered no prompt (generate.json has the counts)
        print(f"specdeploy-distill {args.step}: {exc}", file=sys.stderr)
        return 1
    line = json.dumps(asdict(summary))  # type: ignore[call-overload]
    print(line)
    _terminate_with(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
