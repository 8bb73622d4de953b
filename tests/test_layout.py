"""The package's layers, read from the source: no import cycle, and each layer imports only those below it.

Every `import` counts, at module level, inside functions and under `TYPE_CHECKING` alike: a cycle
hidden in a function body is still a cycle a reader has to untangle.

    blocksync.pipeline, blocksync.ml      use the engine, never the reverse
    blocksync.engine.driver               may use worker (it ships the worker function), comm, shared
    blocksync.engine.worker               may use comm and the shared definitions, never the driver
    blocksync.engine.comm                 only the shared definitions
    blocksync.engine.<module>             (shared definitions) only each other
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

LIB = Path(__file__).resolve().parent.parent / "lib"
PACKAGE = LIB / "blocksync"
MAX_DOCSTRING_LINES = 15


def _module_name(path: Path) -> str:
    parts = path.relative_to(LIB).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """The blocksync modules (not packages' `__init__`) that `path` imports anywhere in its body."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        for name in names:
            if name in known:
                found.add(name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    packages = {name for name, path in modules.items() if path.name == "__init__.py"}
    graph = {}
    for name, path in modules.items():
        if path.name == "__init__.py":
            continue
        graph[name] = {m for m in _imports(path, set(modules)) if m not in packages and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _layer(module: str) -> str:
    parts = module.split(".")
    if parts[1] in ("pipeline", "ml"):
        return "app"
    if parts[1] == "engine" and len(parts) == 4:
        return parts[2]  # driver, worker, comm
    return "shared" if parts[1] == "engine" else "top"


ALLOWED = {
    "shared": {"shared"},
    "comm": {"shared", "comm"},
    "worker": {"shared", "comm", "worker"},
    "driver": {"shared", "comm", "worker", "driver"},
    "app": {"shared", "comm", "worker", "driver", "app"},
    "top": {"shared", "comm", "worker", "driver", "app", "top"},
}


def test_no_module_in_lib_takes_part_in_an_import_cycle():
    assert _cycles(_graph()) == []


def test_the_cycle_finder_finds_a_cycle_two_modules_long_and_one_three_long():
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": {"a"}}
    assert sorted(_cycles(graph)) == [["a", "b"], ["c", "d", "e"]]


def test_each_layer_imports_only_the_layers_below_it():
    bad = [f"{module} ({_layer(module)}) imports {dep} ({_layer(dep)})"
           for module, deps in sorted(_graph().items()) for dep in sorted(deps)
           if _layer(dep) not in ALLOWED[_layer(module)]]
    assert bad == []


def test_the_engine_is_cut_into_driver_worker_and_comm_packages():
    layers = {_layer(m) for m in _graph() if m.startswith("blocksync.engine.")}
    assert layers == {"shared", "driver", "worker", "comm"}


@pytest.mark.parametrize("name", sorted(m for m in _modules() if m.startswith("blocksync.engine")))
def test_engine_module_docstrings_stay_short(name):
    doc = ast.get_docstring(ast.parse(_modules()[name].read_text())) or ""
    assert doc, f"{name} has no module docstring"
    assert len(doc.splitlines()) <= MAX_DOCSTRING_LINES, f"{name}: {len(doc.splitlines())} docstring lines"


PUBLIC = {
    "blocksync": ["BlockInfo", "CollectiveError", "Input", "InputSpec", "ModelSpec", "SavedModel", "TrainConfig",
                  "TrainResult", "TrainingError", "load_model", "make_blocks", "train", "train_blocks", "train_files"],
    "blocksync.ml": ["BlockSyncClassificationModel", "BlockSyncClassifier", "BlockSyncRegressionModel",
                     "BlockSyncRegressor"],
}


@pytest.mark.parametrize("package", sorted(PUBLIC))
def test_the_public_api_keeps_its_names_through_the_engine_s_moves(package):
    import importlib

    module = importlib.import_module(package)
    assert sorted(module.__all__) == PUBLIC[package]
    missing = [name for name in PUBLIC[package] if getattr(module, name, None) is None]
    assert missing == []
