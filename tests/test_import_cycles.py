"""Every part of the repository imports one way: this reads the sources,
builds the graph of imports between modules and fails naming any cycle.

- Rust crates (Ivy, Tulip, the wire, telemetry): one module per file; an
  edge for every `crate::`/`super::`/`self::` path and `use` of a child
  module, except to the module's own ancestors (a child may use what its
  parent declares); and, separately, every edge between two top-level
  modules, so a folder never imports back up. Test code (`#[cfg(test)] mod
  tests`, `tests.rs`) and comments are left out: what ships counts.
- Python packages (`rose`, `tulip`, `tulip_rose_cli`, `bench`, the test
  support): every import of one of them, module-level or inside a function
  (an import moved into a function to dodge a cycle is still a cycle), but
  not imports for type checking only (`if TYPE_CHECKING:`); modules, and
  separately the packages they sit in.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.support.servers import REPO

RUST_CRATES = ["ivy/src", "tulip/src", "proto/src", "telemetry/src"]
PYTHON_ROOTS = ["rose", "tulip", "tulip_rose_cli", "bench", "tests/support"]

Graph = dict[str, set[str]]


def find_cycle(graph: Graph) -> list[str] | None:
    """One cycle of ``graph`` as the nodes on it (the first repeated), or None."""
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt, stack)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node, [])
            if found:
                return found
    return None


# Rust.

def rust_modules(src: Path) -> dict[tuple[str, ...], str]:
    """Module path (below the crate) → its shipped code."""
    out = {}
    for path in src.rglob("*.rs"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "tests":
            continue
        if parts[-1] in ("mod", "main", "lib"):
            parts.pop()
        out[tuple(parts)] = shipped(path.read_text())
    return out


def shipped(text: str) -> str:
    """The file without its test module and without comments."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "#[cfg(test)]" and i + 1 < len(lines) and lines[i + 1].lstrip().startswith("mod tests"):
            break
        out.append(line.split("//", 1)[0])
    return "\n".join(out)


def expand(tree: str) -> list[list[str]]:
    """``a::{b::C, d}`` → ``[a, b, C]``, ``[a, d]``."""
    if "{" not in tree:
        return [[s for s in tree.split(" as ")[0].split("::") if s]]
    open_ = tree.index("{")
    prefix = [s for s in tree[:open_].split("::") if s]
    inner = tree[open_ + 1: tree.rindex("}")]
    parts, depth, start = [], 0, 0
    for i, c in enumerate(inner):
        depth += c == "{"
        depth -= c == "}"
        if c == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    parts.append(inner[start:])
    return [prefix + tail for p in parts if p for tail in expand(p)]


def absolute(module: tuple[str, ...], segs: list[str], children: set[str]) -> tuple[str, ...] | None:
    if not segs:
        return None
    first = segs[0]
    if first == "crate":
        return tuple(segs[1:])
    if first == "self":
        return module + tuple(segs[1:])
    if first == "super":
        base, rest = list(module), list(segs)
        while rest and rest[0] == "super":
            base.pop()
            rest.pop(0)
        return tuple(base + rest)
    if first in children:
        return module + tuple(segs)
    return None


def rust_graphs(known: dict[tuple[str, ...], str]) -> tuple[Graph, Graph]:
    files: Graph = {}
    tops: Graph = {}
    for module, code in known.items():
        children = {k[len(module)] for k in known if len(k) == len(module) + 1 and k[: len(module)] == module}
        paths = []
        for m in re.finditer(r"^\s*(?:pub(?:\([^)]*\))?\s+)?use\s+([^;]+);", code, re.M):
            paths += [absolute(module, p, children) for p in expand("".join(m.group(1).split()))]
        for m in re.finditer(r"(?<![\w:])((?:crate|super)::[\w:]+)", code):
            paths.append(absolute(module, [s for s in m.group(1).split("::") if s], children))
        for path in filter(None, paths):
            to = next((path[:n] for n in range(len(path), -1, -1) if path[:n] in known), None)
            if to is None:
                continue
            if module[: len(to)] != to:  # not an ancestor
                files.setdefault("::".join(module) or "crate", set()).add("::".join(to) or "crate")
            if module and to and module[0] != to[0]:
                tops.setdefault(module[0], set()).add(to[0])
    return files, tops


@pytest.mark.parametrize("crate", RUST_CRATES)
def test_no_cycle_between_a_crates_modules(crate):
    known = rust_modules(REPO / crate)
    assert known, f"read no module from {crate}"
    files, tops = rust_graphs(known)
    for what, graph in (("modules", files), ("top-level modules", tops)):
        cycle = find_cycle(graph)
        assert cycle is None, f"import cycle between {crate}'s {what}: {' -> '.join(cycle)}"


def test_the_rust_reader_sees_grouped_and_relative_paths():
    known = {("a",): "use crate::{b::X, c};\n", ("b",): shipped("// use crate::a;\nfn f() {}\n"),
             ("c",): "fn g() { super::a::h() }\n"}
    files, _ = rust_graphs(known)
    assert files["a"] == {"b", "c"} and "b" not in files, files
    assert find_cycle(files) == ["a", "c", "a"]


# Python.

def python_modules() -> dict[str, Path]:
    out = {}
    for root in PYTHON_ROOTS:
        for path in (REPO / root).rglob("*.py"):
            rel = path.relative_to(REPO).with_suffix("")
            parts = list(rel.parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def python_imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The repository's modules ``name`` imports (type-checking-only
    imports left out)."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip |= {id(n) for n in ast.walk(node)}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")
                up = up[: len(up) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        for t in targets:
            # The longest known module it names (an attribute of a module is
            # that module).
            while t and t not in known:
                t = t.rpartition(".")[0]
            if t and t != name:
                out.add(t)
    return out


def test_no_cycle_between_python_modules_or_packages():
    mods = python_modules()
    assert len(mods) > 50
    known = set(mods)
    files: Graph = {m: python_imports(m, p, known) for m, p in mods.items()}
    # An edge to one's own package (its __init__) is a child reading its
    # namespace, as in Rust; the package level has its own graph below.
    files = {m: {t for t in ts if not m.startswith(t + ".")} for m, ts in files.items()}
    cycle = find_cycle(files)
    assert cycle is None, f"import cycle between modules: {' -> '.join(cycle)}"
    packages: Graph = {}
    for m, ts in files.items():
        pm = m if (mods[m].name == "__init__.py") else m.rpartition(".")[0]
        for t in ts:
            pt = t if mods[t].name == "__init__.py" else t.rpartition(".")[0]
            if pm and pt and pm != pt and not pm.startswith(pt + ".") and not pt.startswith(pm + "."):
                packages.setdefault(pm, set()).add(pt)
    cycle = find_cycle(packages)
    assert cycle is None, f"import cycle between packages: {' -> '.join(cycle)}"
