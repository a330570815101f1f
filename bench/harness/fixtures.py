"""The data under ``tests/data`` that tests and benchmarks share: corpus
lines and tokenizers. A large file is tracked as ``NAME.gz`` (the tree
travels to machines with a size limit) and unpacked next to it,
git-ignored, on first use (``python -m bench.harness.fixtures`` unpacks them all)."""

from __future__ import annotations

import gzip
import os
import shutil
import tempfile
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "tests" / "data"
TOKENIZERS = DATA / "tokenizers"


def unpacked(path: Path) -> Path:
    """``path`` itself, unpacked from ``path.gz`` first when only that
    exists. Safe when several processes race: each writes a temporary file
    and renames it into place."""
    path = Path(path)
    gz = path.with_name(path.name + ".gz")
    if path.is_file() or not gz.is_file():
        return path
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with gzip.open(gz, "rb") as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


def corpus_lines(name: str = "calibration_miracl.txt") -> list[str]:
    """Non-empty lines of a corpus file, stripped of the BOM and line ends."""
    text = (DATA / "corpus" / name).read_text(encoding="utf-8-sig")
    return [line.strip() for line in text.splitlines() if line.strip()]


def tokenizer_dir(name: str) -> Path:
    """``tests/data/tokenizers/<name>`` with every compressed file in it
    unpacked."""
    d = TOKENIZERS / name
    for gz in d.glob("*.gz"):
        unpacked(gz.with_suffix(""))
    return d


def unpack_all() -> None:
    """Every compressed fixture (for tools that read the folder directly)."""
    for gz in DATA.rglob("*.gz"):
        unpacked(gz.with_suffix(""))


if __name__ == "__main__":
    unpack_all()
