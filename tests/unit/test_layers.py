"""Imports point downwards only (STYLE.md §1), and pika stays under taskq/broker/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "taskq"

LAYERS = {
    1: {
        "errors", "settings", "codec", "message", "received", "retry", "broker.topology",
        "_clock",
    },
    2: {
        "broker", "broker.connection", "broker.publisher", "broker.subscription", "db",
        "schema", "outbox.store", "idempotency", "results", "delay",
    },
    3: {
        "app", "task", "registry", "middleware", "outbox", "outbox.relay", "worker", "dlq",
        "status",
        "eager",
    },
    4: {"cli", "testing", "contrib", "__main__", "__init__"},
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
