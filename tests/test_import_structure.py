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


# The layers under the HTTP API: none of them may import it (the API is a front end over them, one of possibly
# several); only the node's entry points (exo.node, exo.main) and the conformance tool, which replays the API's
# encoders, sit above it.
_BELOW_THE_API = ("exo.shared", "exo.models", "exo.tool_calls", "exo.cluster", "exo.worker", "exo.master", "exo.mcp")


def _importers_of(prefix: str, graph: Mapping[str, set[str]]) -> dict[str, list[str]]:
    return {
        module: sorted(target for target in targets if target == prefix or target.startswith(f"{prefix}."))
        for module, targets in graph.items()
        if any(target == prefix or target.startswith(f"{prefix}.") for target in targets)
    }


def test_no_layer_under_the_api_imports_it() -> None:
    importers = _importers_of("exo.api", import_graph())
    assert {module: targets for module, targets in importers.items() if module.startswith(_BELOW_THE_API)} == {}


def test_the_api_imports_nothing_from_the_worker() -> None:
    importers = _importers_of("exo.worker", import_graph())
    assert {module: targets for module, targets in importers.items() if module.startswith("exo.api")} == {}


def test_shared_imports_only_shared() -> None:
    graph = import_graph()
    outside = {
        module: sorted(target for target in targets if not target.startswith("exo.shared"))
        for module, targets in graph.items()
        if module.startswith("exo.shared")
    }
    assert {module: targets for module, targets in outside.items() if targets} == {}


def test_the_api_takes_error_classes_from_shared_errors_only() -> None:
    """shared/errors.py's rule: the API maps the errors the layers below raise, importing them from exo.shared.errors
    and never from the cluster, model or worker modules that raise them."""
    found: list[str] = []
    for path in sorted((SOURCE / "exo" / "api").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(("exo.cluster", "exo.models")):
                found += [
                    f"{path.name}: {node.module}.{alias.name}" for alias in node.names if alias.name.endswith("Error")
                ]
    assert found == []


def test_dialect_wire_types_live_in_the_api() -> None:
    """Anthropic's, OpenAI Responses' and Ollama's wire types belong to the API that speaks them, not to shared."""
    dialect_words = ("anthropic", "openai_responses", "ollama")
    assert [m for m in import_graph() if m.startswith("exo.shared") and any(w in m for w in dialect_words)] == []
