"""Ivy's heap stays off transparent huge pages (ivy/src/main.rs): mimalloc
asks for them, and with them Ivy's resident size moved in 2 MiB steps over
a soak with nothing leaking."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest


def _field(text: str, name: str) -> str:
    return next(line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(name + ":"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_THP_DISABLE) is Linux's")
def test_ivy_heap_has_no_transparent_huge_pages(ivy_minilm):
    # A batch large enough to grow the heap past a huge page's 2 MiB.
    status, body = ivy_minilm.post_json("/v1/embeddings", {"input": ["a sentence about the weather " * 40] * 64})
    assert status == 200, body
    proc = Path(f"/proc/{ivy_minilm.proc.pid}")
    assert _field((proc / "status").read_text(), "THP_enabled") == "0"
    assert _field((proc / "smaps_rollup").read_text(), "AnonHugePages") == "0 kB"
