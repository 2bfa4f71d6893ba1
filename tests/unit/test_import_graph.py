"""The house runs one way: a test over every module's imports (function-level ones included) that
fails on an import circle and on an import against the layers ``flowgrpo.layers`` declares
(docs/design.md, "Layers")."""

from __future__ import annotations

import ast
from pathlib import Path

from flowgrpo.layers import GROUND, LAYERS

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("flowgrpo", "samplers", "reward_models", "pipelines")


def modules() -> dict[str, Path]:
    """Every module of the project's packages: ``{dotted name: file}``."""
    found = {}
    for package in PACKAGES:
        for file in (ROOT / package).rglob("*.py"):
            parts = list(file.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = file
    return found


def imports(name: str, file: Path, known: dict[str, Path]) -> set[str]:
    """The project modules ``name`` imports anywhere in its file (inside functions too)."""

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(file.read_text())):
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            targets = [f"{base}.{a.name}" for a in node.names]
        for target in targets:
            found = resolve(target)
            if found and found != name:
                out.add(found)
    return out


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, file, known) for name, file in known.items()}


def unit_of(name: str) -> tuple[int, str]:
    """``(layer index, unit)``: the longest declared prefix that holds ``name``."""
    best = None
    for index, (_, units) in enumerate(LAYERS):
        for unit in units:
            inside = name == unit or (unit != "flowgrpo" and name.startswith(unit + "."))
            if inside and (
                    best is None or len(unit) > len(best[1])):
                best = (index, unit)
    assert best is not None, f"{name} is in no declared layer"
    return best


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def violations(edges: dict[str, set[str]]) -> list[str]:
    """Every import against the declared order, as ``a -> b (why)``."""
    bad = []
    for a, targets in sorted(edges.items()):
        layer_a, unit_a = unit_of(a)
        for b in sorted(targets):
            layer_b, unit_b = unit_of(b)
            if unit_a in GROUND and b != "flowgrpo.errors":
                bad.append(f"{a} -> {b} (the ground imports only flowgrpo.errors)")
            elif layer_b > layer_a:
                bad.append(f"{a} -> {b} ({LAYERS[layer_a][0]} imports {LAYERS[layer_b][0]})")
            elif layer_b == layer_a and unit_a != unit_b and unit_a not in GROUND:
                bad.append(f"{a} -> {b} ({unit_a} and {unit_b} share a layer)")
    return bad


def test_the_graph_sees_function_level_and_relative_imports():
    edges = graph()
    # `flowgrpo train` imports the trainer inside a function; samplers import their base
    # relatively
    assert "flowgrpo.training.trainer" in edges["flowgrpo.cli.main"]
    assert "samplers.base" in edges["samplers.sde"]
    assert len(edges) > 90


def test_no_import_circle():
    assert cycles(graph()) == []


def test_imports_follow_the_declared_layers():
    assert violations(graph()) == []


def test_the_checks_catch_a_circle_and_an_upward_import():
    edges = {"flowgrpo.rl.kl": {"flowgrpo.training.trainer"},
             "flowgrpo.training.trainer": {"flowgrpo.rl.kl"},
             "samplers.base": {"pipelines.base"}, "flowgrpo.registry": {"flowgrpo.seeding"},
             "reward_models.base": {"pipelines.base"}}
    assert cycles(edges) == [["flowgrpo.rl.kl", "flowgrpo.training.trainer"]]
    assert violations(edges) == [
        "flowgrpo.registry -> flowgrpo.seeding (the ground imports only flowgrpo.errors)",
        "flowgrpo.rl.kl -> flowgrpo.training.trainer (rl imports training)",
        "reward_models.base -> pipelines.base (reward_models and pipelines share a layer)",
        "samplers.base -> pipelines.base (math imports libraries)",
    ]


def test_every_module_sits_in_a_layer():
    for name in modules():
        unit_of(name)
