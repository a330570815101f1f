"""The documentation's flag tables against the binaries' ``--help`` (issue
32): every flag that ``ivy``, ``python -m tulip`` and ``tulip-rose embed``
take appears in a table of its section, so a newcomer reading the README
never meets an undocumented flag. Tables are read from README.md and every
docs/*.md (the README may be split into docs/); a table belongs to the
binary its nearest heading names."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.servers import IVY_BIN, REPO

FLAG = re.compile(r"--[a-z][a-z0-9-]*")
# Flags every binary has that need no table row.
GENERIC = {"--help", "--version"}


def _owner(heading: str) -> str | None:
    h = heading.lower()
    if "embed" in h and "tulip-rose" in h:
        return "embed"
    if "ivy" in h:
        return "ivy"
    if "tulip" in h and "tulip-rose" not in h:
        return "tulip"
    return None


def documented() -> dict[str, set[str]]:
    """Flags named in markdown tables, by the binary of their section."""
    found: dict[str, set[str]] = {"ivy": set(), "tulip": set(), "embed": set()}
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for path in files:
        if not path.is_file():
            continue
        owner, fenced = None, False
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("```"):
                fenced = not fenced
            elif not fenced and line.startswith("#"):
                owner = _owner(line)
            elif not fenced and line.startswith("|") and owner:
                found[owner].update(FLAG.findall(line))
    return found


def ivy_flags() -> set[str]:
    if not IVY_BIN.is_file():
        pytest.skip(f"{IVY_BIN} is not built")
    text = subprocess.run([str(IVY_BIN), "--help"], capture_output=True, text=True, timeout=30).stdout
    # Options start their own line in clap's long help.
    return {m.group(1) for m in re.finditer(r"^\s+(?:-\w, )?(--[a-z][a-z0-9-]*)", text, re.M)}


def tulip_flags() -> set[str]:
    from tulip.launcher import parser

    return {o for a in parser()._actions for o in a.option_strings if o.startswith("--")}


def embed_flags() -> set[str]:
    from tulip_rose_cli.cli import parser

    sub = next(a for a in parser()._actions if hasattr(a, "choices") and a.choices and "embed" in a.choices)
    return {o for a in sub.choices["embed"]._actions for o in a.option_strings if o.startswith("--")}


@pytest.mark.parametrize("binary,flags", [("ivy", ivy_flags), ("tulip", tulip_flags), ("embed", embed_flags)])
def test_every_flag_is_in_the_readme_tables(binary, flags):
    have = flags() - GENERIC
    assert len(have) > 5, have  # the help was read
    missing = sorted(have - documented()[binary])
    assert not missing, f"{binary} flags missing from the documentation's tables: {missing}"
