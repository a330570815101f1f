"""The work directory that makes a run resumable: ``OUTPUT.partial/`` holds a
manifest (the input's fingerprint and every option that changes the
vectors) and one file per finished batch, ``chunk-00000042.npz``, each
written to a temporary name, synced and renamed, so a file that exists is
complete. A rerun skips the batches whose files exist; the final output is
assembled from them in input order, then the directory is removed."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

MANIFEST = "manifest.json"
VERSION = 1


class ResumeRefused(Exception):
    """The work directory belongs to a run with another input or options."""


@dataclass
class Chunk:
    """One finished batch: the good rows' indices, ids and outputs, the bad
    rows' error records (JSON objects), and the tokens Ivy counted."""

    rows: list[int] = field(default_factory=list)
    ids: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)
    tokens: int = 0


def chunk_name(k: int) -> str:
    return f"chunk-{k:08d}.npz"


class WorkDir:
    def __init__(self, output: Path):
        self.path = output.with_name(output.name + ".partial")

    def open(self, manifest: dict, fresh: bool) -> int:
        """Creates the directory, or checks that the one there was made by
        the same input and options; returns how many batches it holds."""
        manifest = {"version": VERSION, **manifest}
        if fresh and self.path.exists():
            shutil.rmtree(self.path)
        old_path = self.path / MANIFEST
        if self.path.exists() and old_path.exists():
            old = json.loads(old_path.read_text())
            diff = sorted(k for k in set(old) | set(manifest) if old.get(k) != manifest.get(k))
            if diff:
                detail = "; ".join(f"{k}: was {old.get(k)!r}, now {manifest.get(k)!r}" for k in diff)
                raise ResumeRefused(
                    f"{self.path} holds a run with another input or options ({detail}). Rerun with the "
                    f"same input and options to resume it, or pass --fresh to discard it and start over.")
            for tmp in self.path.glob("*.tmp"):
                tmp.unlink()
            return len(list(self.path.glob("chunk-*.npz")))
        # Absent, or created but killed before its manifest: start over.
        shutil.rmtree(self.path, ignore_errors=True)
        self.path.mkdir(parents=True)
        self._atomic(MANIFEST, lambda f: f.write(json.dumps(manifest, indent=1).encode()))
        return 0

    def done(self, k: int) -> bool:
        return (self.path / chunk_name(k)).exists()

    def write(self, k: int, chunk: Chunk, kind: str, string_ids: bool) -> None:
        # Any: numpy's stub would check **arrays against savez's allow_pickle: bool too.
        arrays: dict[str, Any] = {
            "rows": np.asarray(chunk.rows, dtype=np.int64),
            "ids": np.asarray(chunk.ids, dtype=str if string_ids else np.int64),
            "errors": np.asarray([json.dumps(e, ensure_ascii=False) for e in chunk.errors], dtype=str),
            "tokens": np.asarray(chunk.tokens, dtype=np.int64),
        }
        arrays.update(_pack(kind, chunk.outputs))
        self._atomic(chunk_name(k), lambda f: np.savez(f, **arrays))

    def read(self, k: int, kind: str) -> Chunk:
        with np.load(self.path / chunk_name(k)) as z:
            return Chunk(rows=z["rows"].tolist(), ids=z["ids"].tolist(), outputs=_unpack(kind, z),
                         errors=[json.loads(e) for e in z["errors"]], tokens=int(z["tokens"]))

    def errors(self, k: int) -> list[dict]:
        """Batch ``k``'s bad rows, without loading its outputs."""
        with np.load(self.path / chunk_name(k)) as z:
            return [json.loads(e) for e in z["errors"]]

    def rows(self, k: int) -> int:
        """How many good rows batch ``k`` holds."""
        with np.load(self.path / chunk_name(k)) as z:
            return len(z["rows"])

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def _atomic(self, name: str, write) -> None:
        tmp = self.path / (name + ".tmp")
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path / name)


def _offsets(lengths) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int64)


def _pack(kind: str, outputs: list) -> dict:
    """A batch's outputs as flat arrays: dense rows stacked; sparse and
    multi-vector rows concatenated with offsets."""
    if kind == "dense":
        return {"vectors": np.stack(outputs) if outputs else np.zeros((0, 0), np.float32)}
    if kind == "sparse":
        return {"offsets": _offsets([len(i) for i, _ in outputs]),
                "indices": np.concatenate([i for i, _ in outputs] or [np.zeros(0, np.int32)]),
                "values": np.concatenate([v for _, v in outputs] or [np.zeros(0, np.float32)])}
    dim = outputs[0].shape[1] if outputs else 0
    return {"offsets": _offsets([len(m) for m in outputs]),
            "vectors": np.concatenate(outputs) if outputs else np.zeros((0, dim), np.float32)}


def _unpack(kind: str, z) -> list:
    if kind == "dense":
        return list(z["vectors"])
    o = z["offsets"]
    if kind == "sparse":
        idx, val = z["indices"], z["values"]
        return [(idx[o[i]:o[i + 1]], val[o[i]:o[i + 1]]) for i in range(len(o) - 1)]
    vec = z["vectors"]
    return [vec[o[i]:o[i + 1]] for i in range(len(o) - 1)]
