"""The server package's import graph has layers and no cycle.

Every import counts, wherever it stands: at the top, inside a function (a lazy import) or under
``TYPE_CHECKING`` (a back edge for the type checker is still a back edge). A module may import modules of its
own layer or of a lower one, never of a higher one; the layers, lowest first:

1. ``core``: the speculative core (scheduler, drafters, acceptance, logits processing): no HTTP, no backend;
2. what engines are built from: the configuration, the tokenizer, the grammar compiler;
3. ``engine``: the engine interface the HTTP layer talks to;
4. ``backends``: the engines (reference, stand-in, TensorRT-LLM);
5. the HTTP layer: ``api`` (routers -> serving -> response building) and the Prometheus metrics it serves;
6. the entry points: the command line, the demo models' builder, the distillation steps.

The HTTP layer knows engines only through the engine interface (no ``api`` -> ``backends`` edge), and nothing
below it imports an HTTP framework.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = "specdeploy_server"
SOURCE = Path(__file__).resolve().parents[2] / "server" / "src" / PACKAGE

#: layer name -> the modules (and packages, with everything under them) it holds; lowest first
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("core", ("", "core")),  # "": the package itself, which holds only its version
    ("engine parts", ("config", "method_settings", "tokenizer", "grammar")),
    ("engine interface", ("engine",)),
    ("backends", ("backends",)),
    ("http", ("api", "metrics")),
    ("entry points", ("cli", "__main__", "demo_models", "demo_training", "quantize", "distill")),
]
#: (importer's layer, imported layer) pairs that the ranks would allow but the design does not
FORBIDDEN = {("http", "backends")}
HTTP_FRAMEWORKS = ("fastapi", "starlette", "uvicorn")
#: the lowest layer allowed to import an HTTP framework
HTTP_LAYER = "http"


def module_name(path: Path, root: Path = SOURCE) -> str:
    parts = [root.name, *path.relative_to(root).with_suffix("").parts]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_names(source: str, module: str, is_package: bool) -> Iterator[str]:
    """Every module name ``source`` imports (``from a import b`` yields ``a.b`` and ``a``: which of them is a
    module is for the caller to know), relative imports resolved against ``module``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(root: Path = SOURCE) -> dict[str, set[str]]:
    """module -> the modules of the package it imports."""
    files = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        is_package = path.name == "__init__.py"
        names = set(imported_names(path.read_text(encoding="utf-8"), module, is_package))
        # `from a import b`: the edge goes to a.b when that is a module, else to a
        edges = {name for name in names if name in files}
        edges -= {name.rpartition(".")[0] for name in edges if name.rpartition(".")[0] in names}
        graph[module] = edges - {module}
    return graph


def third_party_imports(root: Path = SOURCE) -> dict[str, set[str]]:
    """module -> the top-level names of what it imports from outside the package."""
    out: dict[str, set[str]] = {}
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        names = imported_names(path.read_text(encoding="utf-8"), module, path.name == "__init__.py")
        out[module] = {name.split(".")[0] for name in names if name and name.split(".")[0] != root.name}
    return out


def layer_of(module: str, layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> str:
    """The layer a module belongs to (its longest matching entry); KeyError for a module no layer holds."""
    best: tuple[int, str] | None = None
    for name, members in layers:
        for member in members:
            full = f"{PACKAGE}.{member}" if member else PACKAGE
            inside = module == full or (member != "" and module.startswith(f"{full}."))
            if inside and (best is None or len(full) > best[0]):
                best = (len(full), name)
    if best is None:
        raise KeyError(f"{module} is in no layer: add it to LAYERS")
    return best[1]


def upward_edges(graph: dict[str, set[str]], layers: list[tuple[str, tuple[str, ...]]] = LAYERS) -> list[str]:
    rank = {name: i for i, (name, _) in enumerate(layers)}
    problems = []
    for module, imports in sorted(graph.items()):
        for imported in sorted(imports):
            low, high = layer_of(module, layers), layer_of(imported, layers)
            if rank[high] > rank[low] or (low, high) in FORBIDDEN:
                problems.append(f"{module} ({low}) imports {imported} ({high})")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


# ------------------------------------------------------------------------------------------ the package
def test_the_server_package_has_no_import_cycle() -> None:
    assert cycles(import_graph()) == []


def test_no_module_imports_a_higher_layer() -> None:
    assert upward_edges(import_graph()) == []


def test_nothing_below_the_http_layer_imports_an_http_framework() -> None:
    rank = {name: i for i, (name, _) in enumerate(LAYERS)}
    offenders = sorted(
        f"{module} imports {name}"
        for module, names in third_party_imports().items()
        for name in names & set(HTTP_FRAMEWORKS)
        if rank[layer_of(module)] < rank[HTTP_LAYER]
    )
    assert offenders == []


def test_the_product_imports_no_test_or_benchmark_code() -> None:
    dev_only = {"tests", "benchmarks", "specdeploy_testkit", "pytest"}
    assert {m: names & dev_only for m, names in third_party_imports().items() if names & dev_only} == {}


def test_every_module_has_a_layer() -> None:
    for module in import_graph():
        layer_of(module)


# ------------------------------------------------------------------------------------------ the checks
@pytest.fixture
def tiny_package(tmp_path: Path) -> Path:
    return _write(
        tmp_path / PACKAGE,
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/types.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from specdeploy_server.core.logits import Constraint\n"
            ),
            "core/logits.py": "from specdeploy_server.core.types import Thing\n",
            "engine.py": "from .core import types\n",
            "api/__init__.py": "",
            "api/app.py": "def build():\n    from specdeploy_server.backends import reference\n",
            "backends/__init__.py": "",
            "backends/reference.py": "import specdeploy_server.api.app\nimport fastapi\n",
        },
    )


def test_a_type_checking_back_edge_is_a_cycle(tiny_package: Path) -> None:
    assert cycles(import_graph(tiny_package)) == [
        ["specdeploy_server.api.app", "specdeploy_server.backends.reference"],
        ["specdeploy_server.core.logits", "specdeploy_server.core.types"],
    ]


def test_relative_and_lazy_imports_are_edges_and_upward_or_forbidden_ones_are_reported(
    tiny_package: Path,
) -> None:
    graph = import_graph(tiny_package)
    assert graph["specdeploy_server.engine"] == {"specdeploy_server.core.types"}
    assert upward_edges(graph) == [
        "specdeploy_server.api.app (http) imports specdeploy_server.backends.reference (backends)",
        "specdeploy_server.backends.reference (backends) imports specdeploy_server.api.app (http)",
    ]
    assert third_party_imports(tiny_package)["specdeploy_server.backends.reference"] >= {"fastapi"}
