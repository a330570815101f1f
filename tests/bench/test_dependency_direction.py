"""The dependency direction of tests/README.md: tests → bench → the shipped
packages, never back. Read from the source (every import statement, at
module level or inside a function), nothing is imported."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# Package → the top-level packages of this repository it must never import.
FORBIDDEN = {
    "bench": {"tests"},
    "tulip_rose_cli": {"tests", "bench"},
    "tulip": {"tests", "bench"},
    "rose": {"tests", "bench"},
}


def imported_roots(path: Path) -> list[tuple[int, str]]:
    """(line, top-level package) of every absolute import in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name.split(".")[0]) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.append((node.lineno, node.module.split(".")[0]))
    return out


def backward_imports(package: str, forbidden: set[str]) -> list[str]:
    root = REPO / package
    return [f"{path.relative_to(REPO)}:{line} imports {name}"
            for path in sorted(root.rglob("*.py")) if "results" not in path.relative_to(root).parts
            for line, name in imported_roots(path) if name in forbidden]


def test_no_import_goes_against_the_direction():
    found = [f for package, forbidden in FORBIDDEN.items() for f in backward_imports(package, forbidden)]
    assert not found, "imports against tests → bench → shipped packages (tests/README.md):\n" + "\n".join(found)


def test_the_scan_sees_imports_inside_functions(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("import os\n\ndef f():\n    from tests.support import servers\n    import bench.stack\n")
    assert imported_roots(module) == [(1, "os"), (4, "tests"), (5, "bench")]
