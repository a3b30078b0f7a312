"""The product's import structure has no cycle: not between modules (lazy imports inside functions count too), and
not between packages at any depth (exo's top-level shared, models, tool_calls, worker...; the sub-packages and
modules side by side inside each, such as tool_calls' grammar/, formats/ and registry), so that each package can be
read, and tested, from the bottom up."""

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[1] / "src"


def _module_name(path: Path, source: Path) -> str:
    parts = path.relative_to(source).with_suffix("").parts
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


def import_graph(source: Path = SOURCE) -> dict[str, set[str]]:
    files = {_module_name(path, source): path for path in source.rglob("*.py")}
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


def _prefix(module: str, depth: int) -> str:
    """The package (or module) `module` lies in at `depth` dotted names: `exo.tool_calls` at 2, and at 3
    `exo.tool_calls.grammar` for everything under grammar/, `exo.tool_calls.registry` for that module."""
    return ".".join(module.split(".")[:depth])


def package_cycles(graph: Mapping[str, set[str]]) -> dict[int, list[list[str]]]:
    """For every package depth, the cycles between the packages and modules at that depth (each module counted
    as the package it lies in there): one sub-package importing another that imports it back, at any depth."""
    deepest = max((module.count(".") + 1 for module in graph), default=0)
    found: dict[int, list[list[str]]] = {}
    for depth in range(2, deepest):
        packages: dict[str, set[str]] = {}
        for module, targets in graph.items():
            edges = packages.setdefault(_prefix(module, depth), set())
            edges.update(
                _prefix(target, depth) for target in targets if _prefix(target, depth) != _prefix(module, depth)
            )
        if depth_cycles := cycles(packages):
            found[depth] = depth_cycles
    return found


def test_no_module_imports_itself_through_others() -> None:
    assert cycles(import_graph()) == []


def test_no_package_imports_itself_through_others_at_any_depth() -> None:
    assert package_cycles(import_graph()) == {}


def test_a_sub_package_cycle_in_a_tree_fails_the_check(tmp_path: Path) -> None:
    """Two sub-packages that import each other through different modules: no module cycle, but a package one."""
    package = tmp_path / "exo" / "formats_home"
    for folder in ("grammar", "formats"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (tmp_path / "exo" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "grammar" / "build.py").write_text("from exo.formats_home.formats.hermes import HERMES\n")
    (package / "grammar" / "lark.py").write_text("WRITER = 1\n")
    (package / "formats" / "hermes.py").write_text("from exo.formats_home.grammar import lark\nHERMES = 1\n")
    graph = import_graph(tmp_path)
    assert cycles(graph) == []
    assert package_cycles(graph) == {3: [["exo.formats_home.formats", "exo.formats_home.grammar"]]}


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
