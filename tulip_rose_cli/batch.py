"""One batch of rows through Ivy: the unit of work of a bulk run, on a
worker thread (``run.py``) or in a Ray task (``ray.py``), which both import
it from here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tulip_rose_cli import readers
from tulip_rose_cli.client import ApiError, Ivy, request_options
from tulip_rose_cli.work import Chunk

if TYPE_CHECKING:
    from tulip_rose_cli.run import Options

# The --kind values and the output kind each asks Ivy for.
KINDS = {"dense": "dense", "sparse": "sparse", "multi-vector": "multi_vector"}


def embed_batch(ivy: Ivy, opts: Options, dim: int, rows: list[readers.Row]) -> Chunk:
    """One batch's outputs and bad rows: a pure function of the rows and
    the options, so a Ray task (``--ray``) computes the very chunk a
    worker thread does."""
    kind = KINDS[opts.kind]
    good = [r for r in rows if r.text is not None]
    errors = [_error(r, r.bad) for r in rows if r.bad is not None]
    outputs, kept, tokens = [], [], 0
    if good:
        body = request_options(opts.truncate, opts.prompt_name, opts.dimensions, opts.priority)
        texts = [r.text for r in good if r.text is not None]  # all of them: the check narrows the type
        got, rejected, tokens = ivy.embed_rows(kind, texts, body)
        for i, (r, out) in enumerate(zip(good, got)):
            if i in rejected:
                errors.append(_error(r, rejected[i]))
            else:
                outputs.append(out)
                kept.append(r)
    widths = {len(v) if kind == "dense" else v.shape[1] for v in outputs} if kind != "sparse" else set()
    if widths - {dim}:  # the file's vector column has one width
        raise ApiError(200, f"the gateway answered vectors of width {sorted(widths)}, not the {dim} it announced")
    errors.sort(key=lambda e: e["row"])
    return Chunk(rows=[r.index for r in kept], ids=[r.id for r in kept], outputs=outputs, errors=errors,
                 tokens=tokens)


def _error(row: readers.Row, reason: str) -> dict:
    # "row" is the row's number as the ids count it (readers.row_number).
    return {"row": readers.row_number(row.index), "line": row.line, "id": row.id, "error": reason}
