"""The operator's import graph: layered, without cycles.

Every module of `operator/src/specdeploy_operator` belongs to one layer below; a module may import its own
layer and the layers below it, never one above. The graph has no cycle, counting every import the source
holds: those under `if TYPE_CHECKING:` and inside functions too (a back edge hidden from the interpreter is
still a cycle for the reader)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "operator" / "src"
PACKAGE = "specdeploy_operator"

LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("package", (PACKAGE,)),
    ("api: the resources' types and the status vocabulary", (f"{PACKAGE}.api",)),
    (
        "builders: pure renderers of children; CRD generation",
        (f"{PACKAGE}.builders", f"{PACKAGE}.crdgen"),
    ),
    (
        "controller, observations: the API client, live-state comparison, status, events, work queue",
        (
            f"{PACKAGE}.controller",
            *(
                f"{PACKAGE}.controller.{name}"
                for name in (
                    "buildstatus",
                    "conditions",
                    "engineusers",
                    "events",
                    "failpoints",
                    "indexes",
                    "kube",
                    "livestate",
                    "metrics",
                    "podcreation",
                    "podstate",
                    "queue",
                    "speculation",
                    "status",
                )
            ),
        ),
    ),
    (
        "controller, plans and the port: what a reconcile should do (pure), and what it needs of the cluster",
        (
            f"{PACKAGE}.controller.deploymentplan",
            f"{PACKAGE}.controller.engineplan",
            f"{PACKAGE}.controller.trainingplan",
            f"{PACKAGE}.controller.promotionplan",
            f"{PACKAGE}.controller.canarywindows",
            f"{PACKAGE}.controller.port",
        ),
    ),
    (
        "controller, reconciles: observe, plan, apply through the port",
        (
            f"{PACKAGE}.controller.deployments",
            f"{PACKAGE}.controller.enginebuilds",
            f"{PACKAGE}.controller.trainings",
        ),
    ),
    (
        "controller, the reconciler: work queue and the port's implementation",
        (f"{PACKAGE}.controller.reconciler", f"{PACKAGE}.controller.trainingrouting"),
    ),
    (
        "entry points: kopf handlers, command lines",
        (f"{PACKAGE}.controller.handlers", f"{PACKAGE}.cli", f"{PACKAGE}.__main__"),
    ),
)


def _modules() -> dict[str, Path]:
    out: dict[str, Path] = {}
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def layer_of(module: str) -> int:
    """The layer of `module`: the one whose longest prefix matches (a package's layer holds its modules unless
    a deeper entry names them)."""
    best, best_length = -1, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            exact = module == prefix
            inside = module.startswith(prefix + ".") and prefix != PACKAGE
            if (exact or inside) and len(prefix) > best_length:
                best, best_length = index, len(prefix)
    if best < 0:
        raise AssertionError(f"{module} is in no layer: add it to LAYERS in {__file__}")
    return best


def _resolve(importer: str, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    package = importer if MODULES[importer].name == "__init__.py" else importer.rsplit(".", 1)[0]
    for _ in range(node.level - 1):
        package = package.rsplit(".", 1)[0]
    return f"{package}.{node.module}" if node.module else package


def imports(module: str) -> Iterator[str]:
    """The operator modules `module` imports, wherever in its source the import is."""
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(module, node)
            # `from package import module` imports the module; `from module import name`, the module.
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names
            ]
        else:
            continue
        for name in targets:
            target = name
            while target and target not in MODULES:
                target = target.rsplit(".", 1)[0] if "." in target else ""
            if target and target != module:
                yield target


GRAPH = {module: sorted(set(imports(module))) for module in MODULES}


def test_every_module_has_a_layer() -> None:
    for module in MODULES:
        layer_of(module)


def test_no_module_imports_a_higher_layer() -> None:
    upward = [
        f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for module, targets in GRAPH.items()
        for target in targets
        if layer_of(target) > layer_of(module)
    ]
    assert upward == []


def _cycle() -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in GRAPH[module]:
            if state.get(target) == 1:
                return [*path[path.index(target) :], target]
            if target not in state:
                found = visit(target)
                if found is not None:
                    return found
        path.pop()
        state[module] = 2
        return None

    for module in sorted(GRAPH):
        if module not in state:
            found = visit(module)
            if found is not None:
                return found
    return None


def test_the_import_graph_has_no_cycle() -> None:
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle or ())


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from .kube import ApiError\n", ["specdeploy_operator.controller.kube"]),
        ("from . import metrics\n", ["specdeploy_operator.controller.metrics"]),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .reconciler import Reconciler\n",
            ["specdeploy_operator.controller.reconciler"],
        ),
        ("from specdeploy_operator.builders import job_name\n", ["specdeploy_operator.builders"]),
        ("def f() -> None:\n    from ..api import conditions\n", ["specdeploy_operator.api.conditions"]),
    ],
)
def test_imports_are_read_wherever_they_are(source: str, found: list[str], tmp_path: Path) -> None:
    """The reader of the graph sees type-checking and function-level imports, relative or absolute."""
    module = "specdeploy_operator.controller.queue"
    original = MODULES[module]
    probe = tmp_path / "queue.py"
    probe.write_text(source)
    MODULES[module] = probe
    try:
        assert sorted(set(imports(module))) == found
    finally:
        MODULES[module] = original
