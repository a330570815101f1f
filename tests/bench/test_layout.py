"""bench/ laid out as bench/README.md ("Layout") says: no loose modules at
its top, no ``sys.path`` edits, every command of ``python -m bench`` a
module of ``bench/suites/``, and every module importable by its dotted name
(so a file moved without its importers fails here, not in an hour-long run)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"


def modules() -> list[str]:
    """Dotted names of every Python module in bench/ (results excluded)."""
    out = []
    for path in sorted(BENCH.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        if "results" in rel.parts:
            continue
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out.append(".".join(parts))
    return out


def test_the_top_of_bench_holds_only_the_command():
    loose = sorted(p.name for p in BENCH.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    assert not loose, f"modules at bench/'s top (harness/, suites/ or scripts/ instead): {loose}"


def test_nothing_in_bench_edits_sys_path():
    found = []
    for path in sorted(BENCH.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr == "path" and isinstance(node.value, ast.Name)
                    and node.value.id == "sys"):
                found.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not found, f"sys.path used (run as python -m bench...): {found}"


def test_every_command_is_a_suite_module():
    from bench.__main__ import COMMANDS

    for command, module in COMMANDS.items():
        path = BENCH / "suites" / f"{module}.py"
        assert path.is_file(), f"{command}: {path} is missing"
        body = ast.parse(path.read_text(encoding="utf-8")).body
        names = {n.name for n in body if isinstance(n, ast.FunctionDef)}
        names |= {t.id for n in body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
        assert {"TITLE", "run", "options"} <= names, f"{command}: {path} lacks TITLE, run() or options()"


def test_every_module_imports():
    """In a fresh interpreter: a module whose import fails on one of
    bench's own names is a broken move; one missing a third-party package
    (the bench extra) is skipped by name."""
    code = (
        "import importlib, json, sys\n"
        "bad, missing = {}, {}\n"
        "for name in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ModuleNotFoundError as e:\n"
        "        (bad if (e.name or '').split('.')[0] in ('bench', 'tests', 'rose', 'tulip', 'tulip_rose_cli')\n"
        "         else missing)[name] = str(e)\n"
        "    except Exception as e:\n"
        "        bad[name] = f'{type(e).__name__}: {e}'\n"
        "print(json.dumps({'bad': bad, 'missing': missing}))\n")
    res = subprocess.run([sys.executable, "-c", code, json.dumps(modules())], cwd=REPO, capture_output=True,
                         text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    report = json.loads(res.stdout.strip().splitlines()[-1])
    assert not report["bad"], report["bad"]
    assert len(report["missing"]) < len(modules()) // 2, report["missing"]
