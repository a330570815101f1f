"""ARCHITECTURE.md's trees against the files: each tree names every source
file under its root, one per line, and nothing that is not there."""

from __future__ import annotations

import re
import subprocess

import pytest

from tests.support.servers import REPO

DOC = REPO / "ARCHITECTURE.md"
SOURCE = re.compile(r"\.(rs|py)$")


def trees() -> dict[str, set[str]]:
    """Root ("ivy/src/") → the files its tree lists, as repository paths."""
    out: dict[str, set[str]] = {}
    for block in re.findall(r"```\n(.*?)```", DOC.read_text(), re.S):
        lines = block.splitlines()
        if not lines or not lines[0].endswith("/") or " " in lines[0]:
            continue
        root, folders, files = lines[0], [], set()
        for line in lines[1:]:
            indent = len(line) - len(line.lstrip(" "))
            if not line.strip():
                continue
            assert indent % 2 == 0 and indent >= 2, f"{root}: odd indentation in {line!r}"
            name = line.split()[0]
            folders = folders[: indent // 2 - 1]
            if name.endswith("/"):
                folders.append(name)
            else:
                files.add(root + "".join(folders) + name)
        out[root] = files
    return out


def tracked(root: str) -> set[str]:
    res = subprocess.run(["git", "ls-files", root], cwd=REPO, capture_output=True, text=True, check=True)
    return {p for p in res.stdout.splitlines() if SOURCE.search(p) and (REPO / p).is_file()}


def test_the_document_has_a_tree_per_service():
    assert {"ivy/src/", "tulip/", "rose/"} <= set(trees())


@pytest.mark.parametrize("root", ["ivy/src/", "tulip/", "rose/"])
def test_each_tree_lists_exactly_its_files(root):
    listed, present = trees()[root], tracked(root)
    missing, extra = sorted(present - listed), sorted(listed - present)
    assert not missing and not extra, (
        f"ARCHITECTURE.md's {root} tree: add {missing} (one line each, with what it holds); remove {extra}")
