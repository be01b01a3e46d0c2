"""docs/package-map.md names every module of the package, and only those."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_MAP = ROOT / "docs" / "package-map.md"
# A map line: "- `beam_spark_runner/<path>.py`: what it holds".
MAP_LINE = re.compile(r"^- `(beam_spark_runner/[\w/]+\.py)`")


def _mapped() -> list[str]:
    text = PACKAGE_MAP.read_text()
    return [m.group(1) for line in text.splitlines() if (m := MAP_LINE.match(line))]


def _tree() -> set[str]:
    return {
        str(path.relative_to(ROOT))
        for path in (ROOT / "beam_spark_runner").rglob("*.py")
        if path.name != "__init__.py" or path.stat().st_size > 0
    }


def test_the_package_map_matches_the_tree() -> None:
    mapped = _mapped()
    assert len(mapped) == len(set(mapped)), "a module is mapped twice"
    tree = _tree()
    assert not tree - set(mapped), f"modules missing from the map: {sorted(tree - set(mapped))}"
    assert not set(mapped) - tree, f"mapped modules not in the tree: {sorted(set(mapped) - tree)}"
