"""What the docs refer to, read from their Markdown: repository paths (in code spans and in relative links),
`make` targets, test functions, test files, metric names, command-line flags and `SPECDEPLOY_*` settings.
tests/docs/test_doc_references.py checks each against the repository."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

from tests.docs.mdshell import fenced_blocks, inline_code

REPO = Path(__file__).resolve().parents[2]

#: The documents a reader is sent through (docs/api.md included: it is generated, but read).
DOCS: tuple[Path, ...] = (
    REPO / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
    REPO / "examples" / "README.md",
    REPO / "benchmarks" / "README.md",
)

#: Python packages of the repository: `specdeploy_` names that are not metrics.
PACKAGES = frozenset(
    {"specdeploy_operator", "specdeploy_server", "specdeploy_localcluster", "specdeploy_testkit"}
)

#: Paths and test files of other repositories that the docs quote as such (TensorRT-LLM's), not ours.
UPSTREAM = frozenset({
    "examples/run.py",
    "docs/source/release-notes.md",
    "docs/source/legacy/tensorrt-backend-removal.md",
    "tests/unittest/_torch/speculative/test_user_provided.py",
    "docs/llama_multi_instance.md",
    "examples/llm-api/llm_mgmn_trtllm_serve.sh",
    "examples/models/core/deepseek_v3/README.md",
    "examples/draft_target_model/README.md",
    "examples/prompt_lookup/README.md",
    "test_draft_len_schedule.py",
    "test_dynamic_spec_decode.py",
})  # fmt: skip

_PATH = re.compile(r"[\w.-]+(?:/[\w.-]+)+/?")
_MAKE = re.compile(r"(?:^|[;&|(]\s*|\$\(\s*)make\s+((?:[\w-]+=\S*\s+)*)([a-z][\w-]*)(?=\s|$|[;&|)])")
_TEST_FUNCTION = re.compile(r"(?<![\w.])test_\w+(?!\w|\.py)")
_TEST_FILE = re.compile(r"(?<![\w/])(test_\w+\.py)")
_METRIC = re.compile(r"(?<![\w.:/-])specdeploy_[a-z0-9_]+")
_LINK = re.compile(r"\]\(([\w./#-]+)\)")
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9_-]*[a-z0-9]")
_SETTING = re.compile(r"(?<![\w])SPECDEPLOY_[A-Z0-9_]*[A-Z0-9]")

#: Flags of other programs that the docs show in their commands (the repository's own are found in its code).
OTHER_PROGRAMS_FLAGS = {
    "helm install/upgrade": frozenset({"--install", "--reuse-values", "--create-namespace"}),
    "kubectl": frozenset({"--overwrite", "--current"}),
    "docker build/run": frozenset({"--build-arg", "--rm", "--gpus", "--ipc", "--shm-size", "--entrypoint"}),
    "TensorRT-LLM's quantize.py": frozenset({"--device_map"}),
}
#: What the repository's code may define flags and settings in (not its Markdown).
_CODE_SUFFIXES = frozenset({".py", ".sh", ".yaml", ".yml", ".tpl", ".toml", ".cfg", ".txt"})


@dataclass(frozen=True)
class Reference:
    doc: Path
    line: int
    kind: str  # "path", "link", "make target", "test function", "test file", "metric", "flag", "setting"
    name: str

    def __str__(self) -> str:
        return f"{self.doc.relative_to(REPO)}:{self.line}: {self.kind} {self.name!r}"


def top_level_entries(root: Path = REPO) -> frozenset[str]:
    """The repository's top-level files and folders that a path in a doc can start with: what is committed,
    not the state the tools leave (`.venv`, `.cluster`)."""
    return frozenset(p.name for p in root.iterdir() if not p.name.startswith(".") or p.name == ".ci")


def _code_lines(markdown: str) -> list[tuple[int, str]]:
    """(line, text) of every code span and of every line of a fenced block."""
    out = [(span.line, span.text) for span in inline_code(markdown)]
    for block in fenced_blocks(markdown):
        out += [(block.line + 1 + i, text) for i, text in enumerate(block.lines)]
    return out


def references(doc: Path, markdown: str, tops: frozenset[str]) -> list[Reference]:
    found: list[Reference] = []
    blocks = fenced_blocks(markdown)
    # drawings and program output: their `--x--` are arrows, not flags
    diagrams = {
        block.line + 1 + i for block in blocks if block.language == "text" for i in range(len(block.lines))
    }
    spans = {(span.line, span.text) for span in inline_code(markdown)}
    for line, text in _code_lines(markdown):
        for match in _PATH.finditer(text):
            path = match.group(0).split("::")[0]
            before, after = text[: match.start()], text[match.end() :]
            if (
                path in UPSTREAM
                or path.split("/")[0] not in tops
                or after.startswith(("<", "*", "{", "$"))
                or before.endswith(("<", "$", "/", ":"))
            ):
                continue
            found.append(Reference(doc, line, "path", path))
        for match in _MAKE.finditer(text):
            found.append(Reference(doc, line, "make target", match.group(2)))
        if (line, text) in spans:  # test names: prose code spans only
            found += [
                Reference(doc, line, "test function", m.group(0)) for m in _TEST_FUNCTION.finditer(text)
            ]
            found += [
                Reference(doc, line, "test file", m.group(1))
                for m in _TEST_FILE.finditer(text)
                if m.group(1) not in UPSTREAM
            ]
        for match in _METRIC.finditer(text):
            name, after = match.group(0), text[match.end() :]
            if name in PACKAGES or after.startswith(("*", "(", ".", "/", "[")):
                continue
            found.append(Reference(doc, line, "metric", name))
        if line not in diagrams:
            found += [Reference(doc, line, "flag", m.group(0)) for m in _FLAG.finditer(text)]
            found += [Reference(doc, line, "setting", m.group(0)) for m in _SETTING.finditer(text)]
    fenced = {block.line + i for block in blocks for i in range(len(block.lines) + 2)}
    for number, text in enumerate(markdown.splitlines(), start=1):
        if number in fenced:
            continue
        for match in _LINK.finditer(re.sub(r"`[^`]*`", "", text)):
            target = match.group(1).split("#")[0]
            if target and not re.match(r"^[a-z][a-z0-9+.-]*:", target):
                found.append(Reference(doc, number, "link", target))
    return found


def makefile_targets(makefile: Path = REPO / "Makefile") -> frozenset[str]:
    targets: set[str] = set()
    for line in makefile.read_text().splitlines():
        match = re.match(r"^([\w.-]+(?:\s+[\w.-]+)*)\s*:(?!=)", line)
        if match:
            targets |= set(match.group(1).split())
    return frozenset(targets)


def defined_tests(tests: Path = REPO / "tests") -> tuple[frozenset[str], frozenset[str]]:
    """The test functions (and methods) defined under tests/, and the names of its test files."""
    functions: set[str] = set()
    files: set[str] = set()
    for source in tests.rglob("*.py"):
        files.add(source.name)
        functions |= set(re.findall(r"^\s*(?:async\s+)?def\s+(test_\w+)", source.read_text(), re.MULTILINE))
    return frozenset(functions), frozenset(files)


@functools.cache
def code_names(root: Path = REPO) -> tuple[frozenset[str], frozenset[str]]:
    """The flags and `SPECDEPLOY_*` names the repository's code, scripts, chart and Makefile spell out (a
    `--x` with `argparse.BooleanOptionalAction` also defines `--no-x`). Read once per process: it reads every
    file of the code, and each doc's check asks for it."""
    texts = [(root / "Makefile").read_text()]
    for top in ("operator", "server", "hack", "charts", "benchmarks", "tests", ".ci"):
        for path in (root / top).rglob("*"):
            if path.is_relative_to(root / "tests" / "docs"):  # the docs' checks plant names that are wrong
                continue
            if path.suffix in _CODE_SUFFIXES and path.is_file() and "egg-info" not in str(path):
                texts.append(path.read_text(errors="replace"))
    text = "\n".join(texts)
    flags = set(_FLAG.findall(text))
    flags |= {f"--no-{flag[2:]}" for flag in flags}
    return frozenset(flags), frozenset(_SETTING.findall(text))


def missing(
    refs: list[Reference],
    *,
    root: Path,
    targets: frozenset[str],
    functions: frozenset[str],
    files: frozenset[str],
    metrics: frozenset[str],
    flags: frozenset[str] = frozenset(),
    settings: frozenset[str] = frozenset(),
) -> list[Reference]:
    """The references that name nothing that exists."""
    others = frozenset().union(*OTHER_PROGRAMS_FLAGS.values())
    bad = []
    for ref in refs:
        if ref.kind == "path":
            ok = (root / ref.name).exists() or (ref.doc.parent / ref.name).exists()  # or beside the doc
        elif ref.kind == "link":
            ok = (ref.doc.parent / ref.name).resolve().exists()
        elif ref.kind == "make target":
            ok = ref.name in targets
        elif ref.kind == "test function":
            ok = ref.name in functions
        elif ref.kind == "test file":
            ok = ref.name in files
        elif ref.kind == "flag":
            ok = ref.name in flags or ref.name in others
        elif ref.kind == "setting":
            ok = ref.name in settings
        else:
            ok = ref.name in metrics
        if not ok:
            bad.append(ref)
    return bad
