"""The layers stay what docs/development.md says: `pipespec` (the engine) <- `analysis` (torch-free,
result files alone) <- `experiments` (entry points and tools). Every import of the three packages, at
module level or inside a function, is read with `ast`: none goes to a higher layer, none closes a
circle, and no function is longer than 80 lines."""

import ast
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = {"pipespec": 0, "analysis": 1, "experiments": 2}
MAX_FUNCTION_LINES = 80


def modules() -> dict[str, Path]:
    found = {}
    for package in LAYERS:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            found[name.removesuffix(".__init__")] = path
    return found


def _owner(name: str, known: dict) -> str | None:
    """The module of ours `name` (a module or a name inside one) belongs to."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def import_graph(known: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules of ours it imports (`from a import b` counts a.b where that is a module)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in known.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(parts + ([base] if base else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
            else:
                continue
            for target in targets:
                owner = _owner(target, known)
                if owner is not None and owner != module:
                    graph[module].add(owner)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_the_walk_finds_a_circle_and_an_upward_import():
    """The checks below can fail: a made-up graph with both faults is caught."""
    graph = {"pipespec.a": {"pipespec.b"}, "pipespec.b": {"pipespec.a", "analysis.x"}}
    assert cycles(graph) == [["pipespec.a", "pipespec.b"]]
    assert upward(graph) == [("pipespec.b", "analysis.x")]


def upward(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    layer = lambda module: LAYERS[module.split(".")[0]]  # noqa: E731
    return sorted((a, b) for a, targets in graph.items() for b in targets if layer(b) > layer(a))


def test_no_import_goes_up_a_layer_and_none_closes_a_circle():
    known = modules()
    graph = import_graph(known)
    assert sum(len(t) for t in graph.values()) > 100, "the walk found too few imports to be reading the code"
    assert upward(graph) == []
    assert cycles(graph) == []


@pytest.mark.parametrize("package", sorted(LAYERS))
def test_no_function_is_longer_than_80_lines(package):
    long = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - min([node.lineno, *(d.lineno for d in node.decorator_list)]) + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_the_entry_points_are_the_modules_development_md_lists():
    """docs/development.md names the entry points of `experiments/` (a module run as
    `python -m experiments.NAME`); every module with a `__main__` block is one of them and no other is."""
    text = (ROOT / "docs" / "development.md").read_text()
    sentence = text.split("An entry point is a module with a `main`", 1)[1].split("Every other module", 1)[0]
    listed = set(sentence.split(":", 1)[1].replace("`", "").replace("\n", " ").strip(" .").split(", "))
    runnable = {path.stem for path in (ROOT / "experiments").glob("*.py")
                if 'if __name__ == "__main__"' in path.read_text()}
    assert listed == runnable
