"""The package's modules import one another without a circle (lazy imports inside functions count too)."""
from __future__ import annotations

import ast

from tests.conftest import ROOT


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for path in (ROOT / "raymt").rglob("*.py"):
        deps = {node.module for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("raymt.")}
        graph[".".join(path.relative_to(ROOT).with_suffix("").parts)] = deps
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for dep in sorted(graph.get(module, ())):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep]
            if dep in graph and dep not in state and (cycle := visit(dep)):
                return cycle
        state[module] = 2
        path.pop()
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_of_the_package_imports_itself_back() -> None:
    graph = import_graph()
    assert "raymt.pipeline.orchestration.settings" in graph["raymt.pipeline.orchestration.driver"]  # the shared job types live apart
    assert find_cycle(graph) is None
