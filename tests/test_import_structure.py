"""The product's import structure has no cycle: not between modules (lazy imports inside functions count too), and
not between exo's top-level packages (shared, models, tool_calls, master, mcp, worker...), so that each package can
be read, and tested, from the bottom up."""

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src"


def _module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.Module, module: str, is_package: bool, known: set[str]) -> Iterator[str]:
    """Every exo module `module` imports, at any depth of its code (a name imported from a package that is a module
    of it counts as that module)."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            found = target
            while found and found not in known:
                found = found.rpartition(".")[0]
            if found and found != module:
                yield found


def import_graph() -> dict[str, set[str]]:
    files = {_module_name(path): path for path in SOURCE.rglob("*.py")}
    known = set(files)
    return {
        module: set(_imported(ast.parse(path.read_text()), module, path.name == "__init__.py", known))
        for module, path in files.items()
    }


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one member (Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph.get(node, ()):
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component: list[str] = []
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


def _top_level(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(import_graph()) == []


def test_no_top_level_package_imports_itself_through_others() -> None:
    packages: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        edges = packages.setdefault(_top_level(module), set())
        edges.update(_top_level(target) for target in targets if _top_level(target) != _top_level(module))
    assert cycles(packages) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
