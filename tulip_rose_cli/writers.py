"""The final files, assembled from the work directory's batches in input
order: Parquet (``id`` plus ``embedding``, or ``indices``/``values`` for
sparse, or ``embeddings`` for multi-vector), or a NumPy ``.npy`` matrix with
its ids in ``OUTPUT-stem.ids.jsonl``; the bad rows in
``OUTPUT.errors.jsonl``. Each file is written under a temporary name and
renamed, so a file under the final name is complete."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from tulip_rose_cli.work import WorkDir

OUTPUT_FORMATS = ("parquet", "npy")
# Rows per Parquet row group: big enough to read fast, small enough that
# assembling never holds more than this in memory.
ROW_GROUP = 8192


def output_format(path: Path, given: str | None) -> str:
    if given:
        return given
    fmt = {".parquet": "parquet", ".pq": "parquet", ".npy": "npy"}.get(path.suffix.lower())
    if fmt is None:
        raise ValueError(f"cannot tell the output format of {path} from its suffix; pass --output-format "
                         f"({', '.join(OUTPUT_FORMATS)})")
    return fmt


def ids_path(output: Path) -> Path:
    return output.with_name(output.stem + ".ids.jsonl")


def errors_path(output: Path) -> Path:
    return output.with_name(output.name + ".errors.jsonl")


def _tmp(path: Path) -> Path:
    return path.with_name(path.name + ".tmp")


def assemble(work: WorkDir, chunks: int, output: Path, fmt: str, kind: str, dim: int,
             string_ids: bool) -> tuple[int, int]:
    """Writes the output and the errors file from ``chunks`` batches of
    ``dim``-wide vectors; returns (rows written, bad rows)."""
    if fmt == "npy":
        written = _npy(work, chunks, output, dim)
    else:
        written = _parquet(work, chunks, output, kind, dim, string_ids)
    return written, write_errors(work, chunks, output)


def write_errors(work: WorkDir, chunks: int, output: Path) -> int:
    """The bad rows of the batches present, in input order; no file (and
    none left from an earlier run) when there are none."""
    path, n = errors_path(output), 0
    with open(_tmp(path), "w", encoding="utf-8") as f:
        for k in range(chunks):
            if work.done(k):
                for e in work.errors(k):
                    f.write(json.dumps(e, ensure_ascii=False) + "\n")
                    n += 1
    if n:
        os.replace(_tmp(path), path)
    else:
        _tmp(path).unlink()
        path.unlink(missing_ok=True)
    return n


def _npy(work: WorkDir, chunks: int, output: Path, dim: int) -> int:
    from numpy.lib.format import open_memmap

    n = sum(work.rows(k) for k in range(chunks))
    out = open_memmap(_tmp(output), mode="w+", dtype=np.float32, shape=(n, dim))
    at = 0
    with open(_tmp(ids_path(output)), "w", encoding="utf-8") as ids:
        for k in range(chunks):
            c = work.read(k, "dense")
            if c.outputs:
                out[at:at + len(c.outputs)] = np.stack(c.outputs)
                at += len(c.outputs)
            ids.writelines(json.dumps(i, ensure_ascii=False) + "\n" for i in c.ids)
    out.flush()
    del out
    os.replace(_tmp(ids_path(output)), ids_path(output))
    os.replace(_tmp(output), output)
    return n


def columns(kind: str, outputs: list, dim: int) -> dict:
    """The output columns of ``outputs`` (None for a row with no output,
    a null in every column): ``embedding`` (fixed-size lists of ``dim``
    float32) for dense; ``indices`` (int32) and ``values`` (float32) lists
    for sparse; ``embeddings`` (lists of ``dim``-wide float32 vectors) for
    multi-vector."""
    import pyarrow as pa

    nulls = [o is None for o in outputs]
    mask = pa.array(nulls, type=pa.bool_()) if any(nulls) else None
    if kind == "dense":
        rows = [np.zeros(dim, np.float32) if o is None else o for o in outputs]
        flat = pa.array(np.concatenate(rows).astype(np.float32, copy=False) if rows else np.zeros(0, np.float32))
        return {"embedding": pa.FixedSizeListArray.from_arrays(flat, dim, mask=mask)}
    present = [o for o in outputs if o is not None]
    lengths = [0 if o is None else len(o[0] if kind == "sparse" else o) for o in outputs]
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.int32))
    if kind == "sparse":
        idx = pa.array(np.concatenate([i for i, _ in present] or [np.zeros(0, np.int32)]).astype(np.int32))
        val = pa.array(np.concatenate([v for _, v in present] or [np.zeros(0, np.float32)]).astype(np.float32))
        return {"indices": pa.ListArray.from_arrays(offsets, idx, mask=mask),
                "values": pa.ListArray.from_arrays(offsets, val, mask=mask)}
    flat = pa.array(np.concatenate(present).reshape(-1).astype(np.float32, copy=False) if present
                    else np.zeros(0, np.float32))
    vectors = pa.FixedSizeListArray.from_arrays(flat, dim)
    return {"embeddings": pa.ListArray.from_arrays(offsets, vectors, mask=mask)}


def _arrow_table(kind: str, ids: list, outputs: list, dim: int, string_ids: bool):
    import pyarrow as pa

    id_col = pa.array(ids, type=pa.string() if string_ids else pa.int64())
    return pa.table({"id": id_col, **columns(kind, outputs, dim)})


def _parquet(work: WorkDir, chunks: int, output: Path, kind: str, dim: int, string_ids: bool) -> int:
    import pyarrow.parquet as pq

    writer, n = None, 0
    ids: list = []  # as Chunk.ids and Chunk.outputs
    outputs: list = []

    def flush():
        nonlocal writer
        table = _arrow_table(kind, ids, outputs, dim, string_ids)
        if writer is None:
            writer = pq.ParquetWriter(_tmp(output), table.schema)
        writer.write_table(table)
        ids.clear()
        outputs.clear()

    for k in range(chunks):
        c = work.read(k, kind)
        ids.extend(c.ids)
        outputs.extend(c.outputs)
        n += len(c.ids)
        if len(ids) >= ROW_GROUP:
            flush()
    if ids or writer is None:
        flush()
    assert writer is not None  # the first flush() opened it
    writer.close()
    os.replace(_tmp(output), output)
    return n
