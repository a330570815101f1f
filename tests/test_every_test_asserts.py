"""Every test can fail: a scan of the test modules' source (no test is run)
that refuses a test function with nothing in it that checks an outcome.

The rule (tests/README.md, "Every test asserts"): a ``test_*`` function of a
``tests/**/test_*.py`` module contains, anywhere in its body (nested
functions included), at least one of
- an ``assert`` statement;
- ``pytest.raises``, ``pytest.warns``, ``pytest.fail`` or
  ``pytest.deprecated_call``;
- a call to a function named ``assert_*`` (``assert_close_vectors``,
  ``np.testing.assert_allclose``, ``torch.testing.assert_close``);
- a call to a helper that itself follows this rule: a function of the same
  module, a method called on ``self``, a function imported by name from a
  module of this repository, or ``module.function`` of a module imported
  from it.
A call that merely might raise (a validator, a request) does not count:
say what it must give with ``assert``."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
EXPECTING = {"raises", "warns", "fail", "deprecated_call"}

Function = ast.FunctionDef | ast.AsyncFunctionDef


class Source:
    """Parsed modules and the rule's verdict per function, computed once."""

    def __init__(self):
        self.trees: dict[Path, ast.Module] = {}
        self.verdicts: dict[tuple[Path, str], bool] = {}

    def tree(self, path: Path) -> ast.Module:
        if path not in self.trees:
            self.trees[path] = ast.parse(path.read_text(encoding="utf-8"), str(path))
        return self.trees[path]

    def functions(self, path: Path) -> dict[str, Function]:
        out: dict[str, Function] = {}
        for node in ast.walk(self.tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.setdefault(node.name, node)
        return out

    def imported(self, path: Path) -> dict[str, tuple[Path, str | None]]:
        """Names bound by ``from X import name`` to a module file of this
        repository: (file, function name), or (file of X.name, None) when
        the name is itself a module."""
        out: dict[str, tuple[Path, str | None]] = {}
        for node in self.tree(path).body:
            if not isinstance(node, ast.ImportFrom):
                continue
            base = _module_file("." * node.level + (node.module or ""), path)
            for alias in node.names:
                sub = _module_file("." * node.level + ".".join(filter(None, [node.module, alias.name])), path)
                if sub is not None:
                    out[alias.asname or alias.name] = (sub, None)
                elif base is not None:
                    out[alias.asname or alias.name] = (base, alias.name)
        return out

    def checks(self, path: Path, fn: Function) -> bool:
        key = (path, f"{fn.name}:{fn.lineno}")
        if key in self.verdicts:
            return self.verdicts[key]
        self.verdicts[key] = False  # a helper calling itself proves nothing
        local, imported = self.functions(path), self.imported(path)
        verdict = False
        for node in ast.walk(fn):
            if isinstance(node, ast.Assert):
                verdict = True
            elif isinstance(node, ast.Call):
                verdict = self._call_checks(node.func, path, fn, local, imported)
            if verdict:
                break
        self.verdicts[key] = verdict
        return verdict

    def _call_checks(self, func: ast.expr, path: Path, fn: Function, local, imported) -> bool:
        if isinstance(func, ast.Name):
            owner, name = None, func.id
        elif isinstance(func, ast.Attribute):
            owner, name = (func.value.id if isinstance(func.value, ast.Name) else ""), func.attr
        else:
            return False
        if name.startswith("assert_"):
            return True
        if name in EXPECTING and (owner == "pytest" or (owner is None and name not in local and name not in imported)):
            return True
        target: tuple[Path, Function | None] | None = None
        if owner in (None, "self") and name in local and local[name] is not fn:
            target = (path, local[name])
        elif owner is None and name in imported and imported[name][1]:
            where, real = imported[name]
            target = (where, self.functions(where).get(real))
        elif owner and owner in imported and imported[owner][1] is None:
            where = imported[owner][0]
            target = (where, self.functions(where).get(name))
        return bool(target and target[1] is not None and self.checks(target[0], target[1]))


def _module_file(module: str, here: Path) -> Path | None:
    """The file of ``module`` (absolute, or relative to ``here``) in this
    repository, or None (a third-party module)."""
    level = len(module) - len(module.lstrip("."))
    parts = [p for p in module.lstrip(".").split(".") if p]
    if level:
        base = here.parent
        for _ in range(level - 1):
            base = base.parent
    else:
        base = REPO
    path = base.joinpath(*parts)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file() and REPO in candidate.parents:
            return candidate
    return None


def unchecked_tests(root: Path = TESTS) -> list[str]:
    """``path:line name`` of every test function under ``root`` that the
    rule refuses."""
    source, out = Source(), []
    for path in sorted(root.rglob("test_*.py")):
        for node in ast.walk(source.tree(path)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                if not source.checks(path, node):
                    out.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name}")
    return out


def test_every_test_function_checks_an_outcome():
    found = unchecked_tests()
    assert not found, ("test functions that check nothing (add an assert, or pytest.raises where an error is "
                       "the outcome; tests/README.md, 'Every test asserts'):\n" + "\n".join(found))


def test_the_scan_refuses_what_it_should_and_accepts_helpers(tmp_path):
    """The rule itself, on a module written here: each refused function is
    refused, each accepted one accepted."""
    root = tmp_path / "tests"
    root.mkdir()
    (root / "test_sample.py").write_text(
        "import pytest\n"
        "def checks(x):\n    assert x\n"
        "def only_calls(x):\n    return x\n"
        "def test_nothing():\n    only_calls(1)\n"
        "def test_validator_only(v):\n    v.validate({})\n"
        "def test_assert():\n    assert 1\n"
        "def test_raises():\n    with pytest.raises(ValueError):\n        int('x')\n"
        "def test_helper():\n    checks(1)\n"
        "def test_assert_named(np):\n    np.testing.assert_allclose(1, 1)\n"
        "def test_nested():\n    def inner():\n        assert 1\n    inner()\n"
        "class TestGroup:\n    def helper(self):\n        assert 1\n"
        "    def test_method(self):\n        self.helper()\n"
        "    def test_empty(self):\n        pass\n", encoding="utf-8")
    refused = {line.split()[-1] for line in unchecked_tests(root)}
    assert refused == {"test_nothing", "test_validator_only", "test_empty"}

