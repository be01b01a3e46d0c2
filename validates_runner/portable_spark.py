"""What Beam's portable Spark runner skips, read from its test in the installed apache_beam.

Beam tests its portable Spark runner (the Java job server running the Python SDK harness)
with ``apache_beam/runners/portability/spark_runner_test.py``: ``SparkRunnerTest`` subclasses
``PortableRunnerTest``, which subclasses ``FnApiRunnerTest``, the suite our ``fnapi`` suite
runs too. Along that chain tests are skipped (``@unittest.skip``, ``raise unittest.SkipTest``,
``if type(self).__name__ in {...}: raise unittest.SkipTest``), run in a reduced form (an
override calling ``super().test_x(...)`` with other arguments), added or removed. This module
reads those files with :mod:`ast` (nothing is imported) and gives each test's status for
``SparkRunnerTest``.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PORTABLE_SPARK_MODULE = "apache_beam.runners.portability.spark_runner_test"
PORTABLE_SPARK_CLASS = "SparkRunnerTest"

RUNS = "runs"
SKIPPED = "skipped"
REDUCED = "reduced"
REPLACED = "replaced"
REMOVED = "removed"
CONDITIONAL = "conditional"


@dataclass(frozen=True)
class TestStatus:
    """How a test of the suite runs for one concrete test class."""

    name: str
    status: str  # RUNS, SKIPPED, REDUCED, REPLACED, REMOVED or CONDITIONAL
    reason: str
    defined_in: str  # the class whose definition decides the status
    line: int


@dataclass
class ClassSource:
    """A test class found in a source file, with its base classes resolved where possible."""

    module: str
    path: Path
    node: ast.ClassDef
    imports: dict[str, str]  # local name -> "module" or "module.attribute"
    bases: list[ClassSource]

    @property
    def name(self) -> str:
        return self.node.name

    def chain(self) -> list[ClassSource]:
        """This class and its resolved bases, most derived first (depth first, deduplicated)."""
        seen: list[ClassSource] = []
        stack = [self]
        while stack:
            current = stack.pop(0)
            if all(current.node is not c.node for c in seen):
                seen.append(current)
                stack[:0] = current.bases
        return seen


def module_path(module: str) -> Path | None:
    """The source file of ``module`` (apache_beam or validates_runner) without importing it."""
    top, _, rest = module.partition(".")
    if top == "validates_runner":
        root = HERE
    else:
        spec = importlib.util.find_spec(top)  # the top-level package only: not imported
        if spec is None or not spec.submodule_search_locations:
            return None
        root = Path(next(iter(spec.submodule_search_locations)))
    path = root.joinpath(*rest.split(".")).with_suffix(".py") if rest else root / "__init__.py"
    return path if path.exists() else None


def _imports(tree: ast.Module) -> dict[str, str]:
    names: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                names[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                names[alias.asname or alias.name] = alias.name
    return names


def load_class(module: str, name: str, _depth: int = 0) -> ClassSource:
    """The class ``module.name`` from its source, with bases followed into other modules."""
    path = module_path(module)
    if path is None:
        raise FileNotFoundError(f"No source for module {module}")
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    imports = _imports(tree)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    if name not in classes:
        raise LookupError(f"No class {name} in {path}")
    node = classes[name]
    bases = []
    for base in node.bases:
        target = _resolve(base, module, classes, imports)
        if target is not None and _depth < 10:
            try:
                bases.append(load_class(*target, _depth=_depth + 1))
            except (FileNotFoundError, LookupError):
                pass  # e.g. unittest.TestCase: outside the suite
    return ClassSource(module, path, node, imports, bases)


def _resolve(
    base: ast.expr, module: str, classes: dict[str, ast.ClassDef], imports: dict[str, str]
) -> tuple[str, str] | None:
    if isinstance(base, ast.Name):
        if base.id in classes:
            return module, base.id
        qualified = imports.get(base.id)
        if qualified and "." in qualified:
            owner, _, attr = qualified.rpartition(".")
            return owner, attr
    elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
        owner_module = imports.get(base.value.id)
        if owner_module:
            return owner_module, base.attr
    return None


def _is_skip_call(node: ast.expr, names: tuple[str, ...]) -> bool:
    func = node.func if isinstance(node, ast.Call) else node
    return (isinstance(func, ast.Attribute) and func.attr in names) or (
        isinstance(func, ast.Name) and func.id in names
    )


def _first_arg(node: ast.expr) -> str:
    if isinstance(node, ast.Call) and node.args:
        arg = node.args[0]
        return str(arg.value) if isinstance(arg, ast.Constant) else ast.unparse(arg)
    return ""


def _skip_in(statement: ast.stmt) -> str | None:
    """The reason if ``statement`` skips the test (``raise SkipTest``, ``self.skipTest``)."""
    if isinstance(statement, ast.Raise) and statement.exc is not None:
        if _is_skip_call(statement.exc, ("SkipTest",)):
            return _first_arg(statement.exc) or "SkipTest"
    if isinstance(statement, ast.Expr) and _is_skip_call(statement.value, ("skipTest",)):
        return _first_arg(statement.value) or "skipTest"
    return None


def _applies_to(test: ast.expr, concrete: str) -> bool | None:
    """Whether ``if <test>:`` holds for the class ``concrete``; None if unknown.

    Understands Beam's ``type(self).__name__ in {...}`` (and ``not in``, ``==``).
    """
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1):
        return None
    left = ast.unparse(test.left)
    if left not in ("type(self).__name__", "self.__class__.__name__"):
        return None
    right, op = test.comparators[0], test.ops[0]
    if isinstance(right, (ast.Set, ast.List, ast.Tuple)):
        names = {e.value for e in right.elts if isinstance(e, ast.Constant)}
        if isinstance(op, ast.In):
            return concrete in names
        if isinstance(op, ast.NotIn):
            return concrete not in names
    if isinstance(right, ast.Constant) and isinstance(op, (ast.Eq, ast.NotEq)):
        return (concrete == right.value) == isinstance(op, ast.Eq)
    return None


def _super_call(function: ast.FunctionDef) -> ast.Call | None:
    for node in ast.walk(function):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == function.name
            and isinstance(node.func.value, ast.Call)
            and isinstance(node.func.value.func, ast.Name)
            and node.func.value.func.id == "super"
        ):
            return node
    return None


def method_status(
    function: ast.FunctionDef, owner: ClassSource, concrete: str, overrides: bool
) -> TestStatus:
    """The status of the test ``function`` defined in ``owner``, for the class ``concrete``.

    ``overrides``: whether a base class of ``owner`` defines the test too.
    """

    def status(kind: str, reason: str) -> TestStatus:
        return TestStatus(function.name, kind, reason, owner.name, function.lineno)

    for decorator in function.decorator_list:
        if _is_skip_call(decorator, ("skip",)):
            return status(SKIPPED, _first_arg(decorator))
        if _is_skip_call(decorator, ("skipIf", "skipUnless")) and isinstance(decorator, ast.Call):
            condition = ast.unparse(decorator.args[0]) if decorator.args else "?"
            return status(CONDITIONAL, f"{condition}: {_first_arg(decorator) or ''}".strip())
    body = list(function.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # docstring
    for statement in body:
        reason = _skip_in(statement)
        if reason is not None:
            return status(SKIPPED, reason)
        if isinstance(statement, ast.If) and statement.body:
            reason = _skip_in(statement.body[0])
            if reason is None:
                break
            applies = _applies_to(statement.test, concrete)
            if applies:
                return status(SKIPPED, reason)
            if applies is None:
                return status(CONDITIONAL, f"if {ast.unparse(statement.test)}: {reason}")
            continue  # a skip for other classes; look further
        break
    if overrides:
        call = _super_call(function)
        if call is None:
            return status(REPLACED, "overridden without calling the base test")
        if call.args or call.keywords:
            arguments = ", ".join(ast.unparse(a) for a in [*call.args, *call.keywords])
            return status(REDUCED, f"runs super().{function.name}({arguments})")
    return status(RUNS, "")


def suite_statuses(test_class: ClassSource, concrete: str | None = None) -> dict[str, TestStatus]:
    """Every ``test_*`` of ``test_class`` (inherited ones too) with its status."""
    concrete = concrete or test_class.name
    chain = test_class.chain()
    statuses: dict[str, TestStatus] = {}
    for index, owner in enumerate(chain):
        class_skip = next(
            (_first_arg(d) for d in owner.node.decorator_list if _is_skip_call(d, ("skip",))),
            None,
        )
        for node in owner.node.body:
            removed = _removed_names(node)
            for name in removed:
                statuses.setdefault(
                    name, TestStatus(name, REMOVED, "removed from the suite", owner.name, 0)
                )
            if not isinstance(node, ast.FunctionDef) or not node.name.startswith("test"):
                continue
            if node.name in statuses:
                continue  # a more derived class decides
            overrides = any(
                isinstance(n, ast.FunctionDef) and n.name == node.name
                for base in chain[index + 1 :]
                for n in base.node.body
            )
            found = method_status(node, owner, concrete, overrides)
            if class_skip is not None and found.status != SKIPPED:
                found = TestStatus(node.name, SKIPPED, class_skip, owner.name, node.lineno)
            statuses[node.name] = found
    return statuses


def _removed_names(node: ast.stmt) -> list[str]:
    """Tests a class body removes: ``test_x = None`` or ``del test_x``."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
        if node.value.value is None:
            targets = list(node.targets)
    elif isinstance(node, ast.Delete):
        targets = list(node.targets)
    return [t.id for t in targets if isinstance(t, ast.Name) and t.id.startswith("test")]


def portable_spark_suite() -> tuple[ClassSource, dict[str, TestStatus]]:
    """Beam's ``SparkRunnerTest`` and the status of each of its tests."""
    test_class = load_class(PORTABLE_SPARK_MODULE, PORTABLE_SPARK_CLASS)
    return test_class, suite_statuses(test_class)


def suite_root(test_class: ClassSource) -> str:
    """The most basic class of ``test_class``'s chain holding tests (e.g. FnApiRunnerTest)."""
    with_tests = [
        c
        for c in test_class.chain()
        if any(isinstance(n, ast.FunctionDef) and n.name.startswith("test") for n in c.node.body)
    ]
    return with_tests[-1].name if with_tests else test_class.name
