"""Shell commands of a Markdown document: what a reader would type, taken from its fenced code blocks and its
inline code spans.

Fenced blocks follow CommonMark's rules: an opening fence of three or more backticks or tildes (indented by
up to three spaces) with an optional info string, closed by a fence of the same character at least as long.
An unclosed fence is an error here (CommonMark would run it to the end of the document).

In a shell block (`bash`, `sh`, `shell`, `zsh`, `console`) a command is a line, with `\\` continuations joined
and everything from an unquoted ` #` on dropped; runs of blanks outside quotes become one space, so aligned
comments do not change a command. In a `console` block only lines that start with a `$ ` prompt are commands
(other lines are output); a `$ ` prompt in the other shell blocks is dropped too. Heredocs and quotes left
open at the end of a line are refused rather than guessed at.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["SHELL_LANGUAGES", "Block", "Command", "InlineCode", "commands", "fenced_blocks", "inline_code"]

SHELL_LANGUAGES = frozenset({"bash", "sh", "shell", "zsh", "console"})

_FENCE = re.compile(r"^(?P<indent> {0,3})(?P<fence>`{3,}|~{3,})(?P<info>.*)$")


@dataclass(frozen=True)
class Block:
    language: str  # the info string's first word, "" when there is none
    line: int  # 1-based line of the opening fence
    lines: tuple[str, ...]  # the content, the fence's indentation removed


@dataclass(frozen=True)
class Command:
    text: str
    line: int  # 1-based line of the document where the command starts
    language: str


@dataclass(frozen=True)
class InlineCode:
    text: str
    line: int


def fenced_blocks(markdown: str) -> list[Block]:
    blocks: list[Block] = []
    lines = markdown.splitlines()
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None or (opening["fence"][0] == "`" and "`" in opening["info"]):
            i += 1
            continue
        fence, indent = opening["fence"], len(opening["indent"])
        closing = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}\s*$")
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not closing.match(lines[i]):
            body.append(_dedent(lines[i], indent))
            i += 1
        if i == len(lines):
            raise ValueError(f"line {start + 1}: the fenced code block is never closed")
        info = opening["info"].strip()
        blocks.append(Block(info.split()[0] if info else "", start + 1, tuple(body)))
        i += 1
    return blocks


def _dedent(line: str, indent: int) -> str:
    removable = len(line) - len(line.lstrip(" "))
    return line[min(indent, removable) :]


def commands(block: Block) -> list[Command]:
    """The commands of a shell block (see the module's docstring); [] for any other language."""
    if block.language not in SHELL_LANGUAGES:
        return []
    console = block.language == "console"
    out: list[Command] = []
    pending: list[str] = []
    start = 0
    for offset, raw in enumerate(block.lines, start=1):
        line = raw.rstrip()
        if pending and console and line.lstrip().startswith("> "):
            line = line.lstrip()[2:]  # a continuation prompt
        if not pending:
            stripped = line.lstrip()
            prompted = stripped.startswith("$ ") or stripped == "$"
            if console and not prompted:
                continue  # output
            if prompted:
                stripped = stripped[1:].lstrip()
            if not stripped or stripped.startswith("#"):
                continue
            line = stripped
            start = block.line + offset
        if line.endswith("\\") and not _in_comment(line):
            pending.append(line[:-1])
            continue
        pending.append(line)
        out.append(Command(_normalise(" ".join(pending), start), start, block.language))
        pending = []
    if pending:
        raise ValueError(f"line {start}: the command ends with a `\\` continuation and no next line")
    return out


def _scan(text: str, line: int) -> list[tuple[str, bool]]:
    """(character, outside quotes) for each character of `text` up to an unquoted comment."""
    out: list[tuple[str, bool]] = []
    quote = ""
    escaped = False
    for i, ch in enumerate(text):
        if escaped:
            out.append((ch, not quote))
            escaped = False
            continue
        if ch == "\\" and quote != "'":
            escaped = True
            out.append((ch, not quote))
            continue
        if quote:
            if ch == quote:
                quote = ""
            out.append((ch, False))
            continue
        if ch in "'\"":
            quote = ch
            out.append((ch, False))
            continue
        if ch == "#" and (i == 0 or text[i - 1] in " \t"):
            break
        if ch == "<" and text[i : i + 2] == "<<" and text[i : i + 3] != "<<<":
            raise ValueError(f"line {line}: heredocs are not supported: {text.strip()}")
        out.append((ch, True))
    if quote:
        raise ValueError(f"line {line}: a {quote} quote is still open at the end of: {text.strip()}")
    return out


def _in_comment(line: str) -> bool:
    """Whether the line's last character is part of a comment (then a trailing `\\` continues nothing)."""
    try:
        return len(_scan(line, 0)) < len(line)
    except ValueError:
        return False  # a quote continued on the next line: not a comment


def _normalise(text: str, line: int) -> str:
    out: list[str] = []
    for ch, outside in _scan(text, line):
        if outside and ch in " \t":
            if out and out[-1] != " ":
                out.append(" ")
            continue
        out.append(ch)
    return "".join(out).strip()


def inline_code(markdown: str) -> list[InlineCode]:
    """The code spans of the text outside fenced blocks. A span may continue on the next line of its paragraph
    (the line break becomes a space), never into the next paragraph."""
    lines = markdown.splitlines()
    inside: set[int] = set()
    for block in fenced_blocks(markdown):
        inside.update(range(block.line - 1, block.line + len(block.lines) + 1))
    spans: list[InlineCode] = []
    paragraph: list[tuple[int, str]] = []
    for index, line in enumerate([*lines, ""]):
        comment = line.lstrip().startswith("<!--") and line.rstrip().endswith("-->")  # not shown to a reader
        if index in inside or not line.strip() or comment:
            spans += _spans(paragraph)
            paragraph = []
        else:
            paragraph.append((index + 1, line))
    return spans


def _spans(paragraph: list[tuple[int, str]]) -> list[InlineCode]:
    if not paragraph:
        return []
    text = "\n".join(line for _, line in paragraph)
    first = paragraph[0][0]
    out: list[InlineCode] = []
    pos = 0
    while True:
        opening = re.compile(r"(?<!`)(`+)(?!`)").search(text, pos)
        if opening is None:
            return out
        ticks = opening.group(1)
        closing = re.compile(rf"(?<!`){ticks}(?!`)").search(text, opening.end())
        if closing is None:
            pos = opening.end()  # a literal run of backticks
            continue
        content = text[opening.end() : closing.start()].replace("\n", " ")
        if content.startswith(" ") and content.endswith(" ") and content.strip():
            content = content[1:-1]
        out.append(InlineCode(content, first + text.count("\n", 0, opening.start())))
        pos = closing.end()
