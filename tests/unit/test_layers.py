"""Imports point downwards only (STYLE.md §1), and pika stays under taskq/broker/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "taskq"

LAYERS = {
    1: {
        "errors", "settings", "codec", "message", "received", "republish", "retry", "request",
        "broker.topology", "broker.specs", "broker.versions", "broker.quorum",
        "_clock", "_suggest", "_table", "calls", "road",
        "schedules.spec", "schedules.catchup",
        "ordering", "ordering.keys", "ordering.arguments", "ordering.changes",
        "ordering.routing", "ordering.spread",
    },
    2: {
        "broker", "broker.connection", "broker.publisher", "broker.subscription", "db",
        "schema", "outbox.store", "outbox.binding", "idempotency", "results", "delay", "sending",
        "schedules.store",
        "workflows.store",
        "states.store",
    },
    3: {
        "app", "task", "registry", "middleware", "outbox", "outbox.relay", "worker", "dlq",
        "status",
        "eager",
        "schedules", "schedules.definitions", "schedules.scheduler", "schedules.beat_process",
        "schedules.report",
        "ordering.in_place", "ordering.status",
        "workflows",
        "states",
    },
    4: {"cli", "testing", "contrib", "dashboard", "__main__", "__init__"},
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    candidates = [module]
    while "." in candidates[-1]:
        candidates.append(candidates[-1].rsplit(".", 1)[0])
    for candidate in candidates:
        for layer, names in LAYERS.items():
            if candidate in names:
                return layer
    raise AssertionError(f"taskq.{module} is in no layer; add it to LAYERS in {__file__}")


def _runtime_imports(tree: ast.Module) -> list[str]:
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            guarded.update(id(child) for child in ast.walk(node))
    names = []
    for node in ast.walk(tree):
        if id(node) in guarded:
            continue
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


MODULES = sorted(p for p in PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_downwards(path: Path) -> None:
    module = _module_name(path)
    own = _layer(module)
    for name in _runtime_imports(ast.parse(path.read_text())):
        if name == "taskq" or not name.startswith("taskq."):
            continue
        target = name.removeprefix("taskq.")
        assert _layer(target) <= own, f"taskq.{module} (layer {own}) imports {name}"


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_pika_only_under_broker(path: Path) -> None:
    module = _module_name(path)
    if module.startswith("broker"):
        return
    for name in _runtime_imports(ast.parse(path.read_text())):
        assert not name.startswith("pika"), f"taskq.{module} imports pika; use taskq.broker"


def _all_imports(tree: ast.Module, modules: set[str]) -> set[str]:
    """Every taskq module ``tree`` imports: type-only and function-level imports included.

    ``from taskq.pkg import submodule`` counts as an import of the submodule only.
    """
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & modules
            found.update(submodules or {node.module})
    return {name.removeprefix("taskq.") for name in found if name.startswith("taskq.")}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` as a path that ends where it starts, or ``None``."""
    state: dict[str, int] = {}  # 1: on the current path, 2: finished

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for target in sorted(graph.get(module, ())):
            if state.get(target) == 1:
                return [*path[path.index(target):], target]
            if target not in state and (found := visit(target, [*path, target])):
                return found
        state[module] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start, [start])):
            return found
    return None


def test_no_import_cycles_even_through_type_only_imports() -> None:
    # A type-only import is still a dependency a reader must follow; a circle of them
    # (app -> task -> app) means no module of the circle can be understood on its own.
    modules = {_module_name(path) for path in MODULES}
    dotted = {f"taskq.{name}" for name in modules}
    graph = {
        _module_name(path): _all_imports(ast.parse(path.read_text()), dotted)
        - {_module_name(path)}
        for path in MODULES
    }
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])
