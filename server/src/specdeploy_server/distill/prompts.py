"""Prompts for self-distillation: read from a file or a directory of files, checked, split into training and
held-out prompts.

Formats, one prompt per line: ``.jsonl`` lines ``{"prompt": "text"}`` (a completion) or
``{"messages": [...]}`` (a chat, OpenAI's message objects); ``.txt`` lines are completion prompts. A
directory contributes every ``.jsonl`` and ``.txt`` file in it, in name order. Blank lines are skipped.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DistillError", "Prompt", "read_lines", "read_prompts", "split"]

SUFFIXES = (".jsonl", ".txt")


class DistillError(ValueError):
    """A step cannot run as asked (prompts or samples missing, unreadable, malformed or empty; a setting or a
    model that cannot work); the message names the file, line, setting or model."""


@dataclass(frozen=True)
class Prompt:
    """A completion prompt (``text``) or a chat (``messages``)."""

    text: str | None = None
    messages: tuple[dict[str, Any], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"prompt": self.text} if self.messages is None else {"messages": list(self.messages)}


def _parse(line: str, where: str) -> Prompt:
    try:
        item = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DistillError(f"{where}: not JSON ({exc.msg})") from exc
    if isinstance(item, dict) and isinstance(item.get("prompt"), str) and item["prompt"]:
        return Prompt(text=item["prompt"])
    messages = item.get("messages") if isinstance(item, dict) else None
    if (
        isinstance(messages, list)
        and messages
        and all(isinstance(m, dict) and isinstance(m.get("role"), str) and "content" in m for m in messages)
    ):
        return Prompt(messages=tuple(messages))
    raise DistillError(f'{where}: expected {{"prompt": "..."}} or {{"messages": [{{"role": ..., ...}}]}}')


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.is_file() and p.suffix in SUFFIXES)
    if path.is_file():
        return [path]
    raise DistillError(f"prompts {path}: no such file or directory")


def read_lines(file: Path, what: str) -> list[str]:
    """The lines of a UTF-8 text file; refused, naming ``what`` and the file, when it cannot be read."""
    try:
        return file.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DistillError(f"{what} {file}: cannot be read ({exc})") from exc


def read_prompts(path: Path) -> list[Prompt]:
    """Every prompt under ``path``; refuses a dataset that is missing, unreadable, malformed or empty."""
    prompts: list[Prompt] = []
    files = _files(path)
    for file in files:
        for number, line in enumerate(read_lines(file, "prompts"), 1):
            if not line.strip():
                continue
            where = f"prompts {file} line {number}"
            prompts.append(_parse(line, where) if file.suffix == ".jsonl" else Prompt(text=line))
    if not prompts:
        names = ", ".join(f.name for f in files) or f"no {' or '.join(SUFFIXES)} file"
        raise DistillError(f"prompts {path}: empty ({names})")
    return prompts


def split(prompts: list[Prompt], samples: int, held_out: int, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """(training prompts, held-out prompts): shuffled with ``seed``, the held-out ones first, then up to
    ``samples`` for training. Refuses a split that leaves nothing to train on."""
    if held_out >= len(prompts):
        raise DistillError(f"heldOut {held_out} leaves none of the {len(prompts)} prompts for training")
    order = list(prompts)
    random.Random(seed).shuffle(order)
    return order[held_out : held_out + samples], order[:held_out]
