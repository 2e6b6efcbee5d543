"""The commands of the README and docs/quickstart.md against the table of how each is exercised
(tests/docs/readme_rows.py), and the parser that reads them from the pages (tests/docs/mdshell.py)."""

from __future__ import annotations

import ast
import shlex
import tomllib
from pathlib import Path

import pytest

from tests.docs.mdshell import SHELL_LANGUAGES, commands, fenced_blocks, inline_code
from tests.docs.readme_rows import (
    COMMAND_PAGES,
    COMMANDS,
    README,
    REPO,
    TEST_MODULES,
    Demo,
    Here,
    MakeTest,
    NotHere,
    Suite,
    is_command,
    readme_command,
    readme_commands,
)
from tests.docs.readme_shell import Shell, make_dry_run, make_target


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_fenced_block_names_its_language(page: Path) -> None:
    """A block without a language could hold commands that nothing checks."""
    unnamed = [block.line for block in fenced_blocks(page.read_text()) if not block.language]
    assert not unnamed, (
        f"{page.name}: fenced blocks without a language (```bash, ```text, ...) at lines {unnamed}"
    )


def test_the_two_commands_come_first() -> None:
    first = next(b for b in fenced_blocks(README.read_text()) if b.language in SHELL_LANGUAGES)
    assert [c.text for c in commands(first)] == ["make demo", "make test"]


def test_every_readme_command_has_a_row() -> None:
    missing = [f for f in readme_commands() if f.text not in COMMANDS]
    assert not missing, "commands with no row in COMMANDS (say how each is exercised):\n" + "\n".join(
        f"  {f}" for f in missing
    )


def test_every_row_is_a_readme_command() -> None:
    texts = {f.text for f in readme_commands()}
    stale = [command for command in COMMANDS if command not in texts]
    assert not stale, "rows of COMMANDS whose command is on no page of COMMAND_PAGES:\n" + "\n".join(stale)


def function_node(path: Path, name: str) -> ast.FunctionDef:
    tree = ast.parse(path.read_text())
    nodes = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
    assert nodes, f"{path.relative_to(REPO)} has no function {name}"
    return nodes[0]


def row_test(name: str) -> ast.FunctionDef:
    """The test function `name` of the README test modules: exactly one of them defines it."""
    found = [
        node
        for module in TEST_MODULES
        for node in ast.parse(module.read_text()).body
        if isinstance(node, ast.FunctionDef) and node.name == name
    ]
    assert len(found) == 1, f"{len(found)} functions {name} in {[m.name for m in TEST_MODULES]}, not one"
    return found[0]


def string_constants(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_row_evidence(command: str, shell: Shell) -> None:
    """What each row claims: the test it names holds the command, or the demo or `make test` runs it."""
    row = COMMANDS[command]
    if isinstance(row, Here | NotHere):
        constants = string_constants(row_test(row.test))
        assert command in constants, f"{row.test} does not run the README command {command!r}"
        if isinstance(row, NotHere):
            assert row.why.strip(), f"say why {command!r} cannot run here"
    elif isinstance(row, Demo):
        demo = make_dry_run(shell, "demo")
        assert "hack/demo.sh .cluster" in demo, f"`make demo` no longer runs hack/demo.sh: {demo}"
        if command.startswith("make "):
            extra = [line for line in make_dry_run(shell, *make_target(command)) if line not in demo]
            assert not extra, f"`make demo` does not run all of `{command}`; it lacks: {extra}"
        else:
            assert row.evidence, f"name what in hack/demo.sh runs {command!r}"
            assert row.evidence in (REPO / "hack" / "demo.sh").read_text(), (
                f"hack/demo.sh lacks {row.evidence!r}"
            )
    elif isinstance(row, Suite):
        path, _, name = row.test.partition("::")
        node = function_node(REPO / path, name)
        source = ast.get_source_segment((REPO / path).read_text(), node) or ""
        assert row.evidence in source, f"{row.test} does not contain {row.evidence!r}"
        if command.startswith("make "):
            assert row.recipe, f"name what `{command}` runs"
            assert any(row.recipe in line for line in make_dry_run(shell, *make_target(command)))
    else:
        assert isinstance(row, MakeTest)
        everything = make_dry_run(shell, "test")
        extra = [line for line in make_dry_run(shell, *make_target(command)) if line not in everything]
        assert not extra, f"`make test` does not run all of `{command}`; it lacks: {extra}"
        assert any(" -m pytest" in line for line in everything), everything
        config = tomllib.loads((REPO / "pyproject.toml").read_text())
        testpaths = config["tool"]["pytest"]["ini_options"]["testpaths"]
        for module in TEST_MODULES:
            assert any(module.is_relative_to(REPO / p) for p in testpaths), (
                f"pytest does not collect {module}"
            )


# -- the parser ----------------------------------------------------------------------------------------------

PARSER_CASES: list[tuple[str, list[str]]] = [
    ("```bash\nmake demo    # comment\n\n# only a comment\nmake test\n```\n", ["make demo", "make test"]),
    (
        "```sh\nhelm install a b \\\n  --set x=1 \\\n  --set y=2\n```\n",
        ["helm install a b --set x=1 --set y=2"],
    ),
    (
        "```console\n$ kubectl get sdep\nNAME   PHASE\nx      Ready\n$ echo 'a  # b'\n```\n",
        ["kubectl get sdep", "echo 'a  # b'"],
    ),
    ("```console\n$ helm install a \\\n> --set b=1\n```\n", ["helm install a --set b=1"]),
    ("```bash\n$ make demo\n```\n```yaml\nkey: value\n```\n", ["make demo"]),
    ("~~~~bash\n```\nnot a fence end\n~~~~\n", ["```", "not a fence end"]),
    ("  ```bash\n  make x   y\n  ```\n", ["make x y"]),
    ("```bash\nfoo # a comment \\\nbar\n```\n", ["foo", "bar"]),
]


@pytest.mark.parametrize(("markdown", "expected"), PARSER_CASES)
def test_commands_of_fenced_blocks(markdown: str, expected: list[str]) -> None:
    assert [c.text for b in fenced_blocks(markdown) for c in commands(b)] == expected


@pytest.mark.parametrize(
    ("markdown", "message"),
    [
        ("```bash\nmake demo\n", "never closed"),
        ("```bash\ncat <<EOF\nx\nEOF\n```\n", "heredocs"),
        ("```bash\necho 'open\n```\n", "quote is still open"),
        ("```bash\nmake \\\n```\n", "continuation"),
    ],
)
def test_what_the_parser_refuses(markdown: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        [c for b in fenced_blocks(markdown) for c in commands(b)]


def test_inline_code_spans_lines_and_fences() -> None:
    markdown = "Run `make\ndemo` or ``a ` b``.\n\n```bash\n`not inline`\n```\nAnd `kubectl get x`.\n"
    spans = [(s.text, s.line) for s in inline_code(markdown)]
    assert spans == [("make demo", 1), ("a ` b", 2), ("kubectl get x", 7)]


def test_inline_commands_are_told_from_mentions() -> None:
    assert is_command("kubectl describe enginebuild ENGINE")
    assert is_command(".ci/run")
    assert is_command("hack/kind-up.sh")
    assert not is_command("kubectl")
    assert not is_command("specdeploy")
    assert not is_command("crds/")
    assert not is_command("nvidia.com/gpu=present:NoSchedule")
    assert not is_command("--set 'a={b}'")


def test_the_retry_command_sets_the_operators_retry_annotation() -> None:
    """The README's retry of a failed build sets the annotation the operator reads (`builders.job`)."""
    from specdeploy_operator.builders.job import RETRY_ANNOTATION

    words = shlex.split(readme_command("kubectl annotate eb ENGINE specdeploy.dev/retry=2 --overwrite"))
    assert words[:3] == ["kubectl", "annotate", "eb"]
    assert any(word.startswith(f"{RETRY_ANNOTATION}=") for word in words)
