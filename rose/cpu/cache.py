"""The CPU fast path's exports on disk (``onnx.py``): one folder per
export, named by what determines it, so a restart loads the last one at
once instead of exporting again (seconds of a core and a copy of the
weights per start).

- **Where**: ``--cache-dir`` (``TULIP_CACHE_DIR``), else
  ``$XDG_CACHE_HOME/tulip-rose``, else ``~/.cache/tulip-rose``.
- **Key**: the model directory's files (path, size, mtime and a hash of
  each file's first MiB: the whole of a config, a safetensors' header),
  ROSE's own source (the exported graph is ROSE's definition), the
  versions of Python, torch, onnx, onnxscript and ONNX Runtime (torch's
  sets the opset), and the export's shape plan (most tokens and sequences);
  an int8 copy's key adds how it was quantized (``int8.py``).
- **Atomic**: an export is written into ``.staging-...`` inside the cache
  and renamed into place whole; a folder without its ``meta.json`` or a
  staging folder is never loaded. Staging folders of processes that are
  gone are removed by the next start.
- **Bounded**: after each new entry the oldest entries (by last use) go
  until the cache holds at most ``--cache-max-bytes``; an entry larger
  than the bound alone is loaded and then removed (0 keeps nothing).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import socket
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

DEFAULT_MAX_BYTES = 2 << 30
STAGING = ".staging-"
META = "meta.json"
# Files up to this size are hashed whole; larger ones by this many first
# bytes (a safetensors' header), with their size and mtime.
HASHED_BYTES = 1 << 20
# A staging folder older than this is abandoned whatever its owner (the
# export's own timeout is shorter: onnx.EXPORT_TIMEOUT_S).
STALE_S = 2 * 3600
_VERSIONED = ("torch", "onnx", "onnxscript", "onnxruntime")
_HOST = "".join(c if c.isalnum() else "_" for c in socket.gethostname())[:32] or "host"


def default_dir() -> Path:
    """``$XDG_CACHE_HOME/tulip-rose``, else ``~/.cache/tulip-rose``."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tulip-rose"


def _file_digest(path: Path, st: os.stat_result) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(HASHED_BYTES))
    if st.st_size <= HASHED_BYTES:
        return h.hexdigest()
    return f"{h.hexdigest()}:{st.st_size}:{st.st_mtime_ns}"


def _tree_digest(root: Path, pattern: str = "*") -> str:
    """The files under ``root`` matching ``pattern`` (hidden ones and
    ``__pycache__`` aside: they change with no change to what is read)."""
    h = hashlib.sha256()
    files = (p for p in root.rglob(pattern) if p.is_file()
             and not any(x.startswith(".") or x == "__pycache__" for x in p.relative_to(root).parts))
    for path in sorted(files):
        st = path.stat()
        h.update(f"{path.relative_to(root)}\0{_file_digest(path, st)}\0".encode())
    return h.hexdigest()


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def export_key(model_dir: Path, plan: Mapping[str, int | str]) -> tuple[str, dict]:
    """The key of an export of ``model_dir`` with the shape ``plan``, and
    what it was made of (kept in the entry's ``meta.json``)."""
    rose_dir = Path(__file__).resolve().parents[1]
    parts = {
        "weights": _tree_digest(Path(model_dir).resolve()),
        "rose": _tree_digest(rose_dir, "*.py"),
        "python": platform.python_version(),
        **{name: _version(name) for name in _VERSIONED},
        **{k: str(v) for k, v in sorted(plan.items())},
    }
    key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]
    return key, {"model_dir": str(model_dir), **parts}


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ExportCache:
    """A folder of exports, one sub-folder per key."""

    def __init__(self, root: Path | str | None, max_bytes: int = DEFAULT_MAX_BYTES):
        self.root = Path(root) if root else default_dir()
        self.max_bytes = max_bytes

    def problem(self) -> str | None:
        """Why exports cannot be written here (a read-only or missing
        disk), or None; creates the folder."""
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f"{STAGING}probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            probe.mkdir()
            probe.rmdir()
        except OSError as e:
            return f"the cache folder {self.root} is not writable ({e.strerror or e}; --cache-dir sets another)"
        return None

    def entry(self, key: str) -> Path:
        return self.root / f"onnx-{key}"

    def has(self, key: str) -> bool:
        """Whether the complete entry of ``key`` is here (not marked as used)."""
        return (self.entry(key) / META).is_file()

    def lookup(self, key: str) -> Path | None:
        """The complete entry of ``key``, marked as just used, or None."""
        entry = self.entry(key)
        if not (entry / META).is_file():
            return None
        try:
            os.utime(entry)  # the last use orders eviction
        except OSError:
            pass
        return entry

    def staging(self) -> Path:
        """A new, empty folder to export into (this process's)."""
        self.sweep()
        path = self.root / f"{STAGING}{_HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        path.mkdir(parents=True)
        return path

    def commit(self, staging: Path, key: str, meta: dict) -> Path:
        """Moves a finished export into place whole; another process's
        entry of the same key, committed first, wins. The entry's path."""
        (staging / META).write_text(json.dumps({**meta, "created": time.time()}, indent=1))
        entry = self.entry(key)
        if entry.exists() and not (entry / META).is_file():  # not one of ours: never loaded, replaced
            shutil.rmtree(entry, ignore_errors=True)
        try:
            os.rename(staging, entry)
        except OSError:  # taken meanwhile (the same export): keep that one
            shutil.rmtree(staging, ignore_errors=True)
            if not (entry / META).is_file():
                raise
        return entry

    def entries(self) -> list[tuple[float, int, Path]]:
        """(last use, bytes, folder) of each complete entry, oldest first."""
        out = []
        for p in self.root.glob("onnx-*"):
            try:
                out.append((p.stat().st_mtime, _size(p), p))
            except OSError:  # removed meanwhile by another process
                continue
        return sorted(out)

    def evict(self, keep: Path | None = None) -> list[Path]:
        """Removes the oldest entries until the cache holds ``max_bytes``
        at most; ``keep`` goes last. The folders removed."""
        entries = self.entries()
        entries.sort(key=lambda e: (e[2] == keep, e[0]))
        total = sum(size for _, size, _ in entries)
        gone = []
        for _, size, path in entries:
            if total <= self.max_bytes:
                break
            shutil.rmtree(path, ignore_errors=True)
            total -= size
            gone.append(path)
        return gone

    def sweep(self) -> list[Path]:
        """Removes staging folders whose process is gone (this host's) or
        that are older than ``STALE_S``: what a killed start left."""
        gone = []
        for p in self.root.glob(f"{STAGING}*"):
            host, _, rest = p.name[len(STAGING):].rpartition("-")[0].rpartition("-")
            try:
                old = time.time() - p.stat().st_mtime > STALE_S
                dead = host == _HOST and rest.isdigit() and not _alive(int(rest))
            except OSError:
                continue
            if old or dead:
                shutil.rmtree(p, ignore_errors=True)
                gone.append(p)
        return gone


def python_env_for_child() -> dict[str, str]:
    """This process's environment with ROSE importable (a clone's root on
    ``PYTHONPATH``), for ``python -m rose...`` children."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
    return env

