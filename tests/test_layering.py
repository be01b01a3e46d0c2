"""The package's layering, as docs/architecture.md states it: checked on the import graph.

Every import of a package module counts, function-level ones too; only imports under
``if TYPE_CHECKING:`` are exempt. A module may import its own layer and the layers below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "beam_spark_runner"

# Top to bottom: each unit (a subpackage or a top-level module) and the layer it sits in.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("__main__", "demo", "runner"),
    ("run",),
    ("streaming",),
    ("translators",),
    ("rewrites", "io"),
    ("planning",),
    ("execution",),
    ("result",),
    ("coders", "monitoring"),
    ("_startup_hook",),
    ("spark",),
    ("workers",),
    ("beam_internals", "options", "errors", "_version"),
)
LAYER_OF = {unit: depth for depth, units in enumerate(LAYERS) for unit in units}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


MODULES = _modules()


class _Imports(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool) -> None:
        self.module, self.is_package, self.found = module, is_package, []

    def visit_If(self, node: ast.If) -> None:
        if "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                self.visit(child)
            return
        self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.found += [alias.name for alias in node.names]

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        module = node.module or ""
        if node.level:
            base = self.module.split(".")
            base = base if self.is_package else base[:-1]
            base = base[: len(base) - node.level + 1]
            module = ".".join(base + ([module] if module else []))
        self.found += [module] + [f"{module}.{alias.name}" for alias in node.names]


def imports(module: str) -> set[str]:
    """The package's modules ``module`` imports (the package itself left out)."""
    path = MODULES[module]
    visitor = _Imports(module, path.name == "__init__.py")
    visitor.visit(ast.parse(path.read_text()))
    targets = set()
    for name in visitor.found:
        parts = name.split(".")
        for end in range(len(parts), 1, -1):
            candidate = ".".join(parts[:end])
            if candidate in MODULES:
                # A package's __init__ re-exporting its own modules is not an edge upward.
                if candidate != module and not module.startswith(candidate + "."):
                    targets.add(candidate)
                break
    return targets


def unit_of(module: str) -> str:
    return module.split(".")[1]


def _cycles(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> Iterator[list[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                yield from visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                yield sorted(component)

    for node in graph:
        if node not in index:
            yield from visit(node)


def test_every_unit_of_the_package_has_a_layer() -> None:
    units = {unit_of(m) for m in MODULES if m != "beam_spark_runner"}
    assert units <= LAYER_OF.keys(), f"add to LAYERS: {sorted(units - LAYER_OF.keys())}"


def test_no_module_imports_a_layer_above_its_own() -> None:
    upward = [
        f"{module} -> {target}"
        for module in sorted(MODULES)
        if module != "beam_spark_runner"
        for target in sorted(imports(module))
        if target != "beam_spark_runner"
        and LAYER_OF.get(unit_of(target), 0) < LAYER_OF.get(unit_of(module), 0)
    ]
    assert not upward, "imports pointing up the layers:\n" + "\n".join(upward)


def test_there_is_no_import_cycle() -> None:
    graph = {module: imports(module) for module in MODULES}
    cycles = list(_cycles(graph))
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)
