"""Prints docs/package-map.md's list from the tree: one line per module.

Each line is the module's path and its docstring's first line; empty ``__init__.py``
files are left out. ``tests/test_docs.py`` checks that the map names exactly the tree's
modules.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    """Prints the map, a paragraph per subpackage."""
    package = ROOT / "beam_spark_runner"
    previous = None
    for path in sorted(
        package.rglob("*.py"), key=lambda p: (p.parent != package, p.parent, p.name)
    ):
        if path.name == "__init__.py" and path.stat().st_size == 0:
            continue
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        if path.parent != previous and previous is not None:
            print()
        previous = path.parent
        summary = docstring.strip().splitlines()[0] if docstring.strip() else ""
        print(f"- `{path.relative_to(ROOT)}`: {summary}")


if __name__ == "__main__":
    main()
