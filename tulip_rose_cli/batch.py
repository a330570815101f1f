"""One batch of rows through Ivy: the unit of work of a bulk run, on a
worker thread (``run.py``) or in a Ray task (``ray.py``), which both import
it from here."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tulip_rose_cli import documents, images, readers
from tulip_rose_cli.client import ApiError, Ivy, Rejected, request_options
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
    if opts.late_chunking:
        outputs, kept, errors, tokens = _late_chunks(ivy, opts, rows)
    elif opts.image_column:
        outputs, kept, errors, tokens = _images(ivy, opts, rows)
    else:
        outputs, kept, errors, tokens = _rows(ivy, opts, kind, rows)
    widths = {len(v) if kind == "dense" else v.shape[1] for v in outputs} if kind != "sparse" else set()
    if widths - {dim}:  # the file's vector column has one width
        raise ApiError(200, f"the gateway answered vectors of width {sorted(widths)}, not the {dim} it announced")
    errors.sort(key=lambda e: e["row"])
    return Chunk(rows=[r.index for r in kept], ids=[r.id for r in kept], outputs=outputs, errors=errors,
                 tokens=tokens)


def _rows(ivy: Ivy, opts: Options, kind: str, rows: list[readers.Row]) -> tuple[list, list, list, int]:
    """The good rows in one request (row by row if Ivy rejects it):
    (outputs, their rows, error records, tokens)."""
    good = [r for r in rows if r.text is not None]
    errors = [_error(r, r.bad) for r in rows if r.bad is not None]
    outputs: list = []
    kept: list[readers.Row] = []
    tokens = 0
    if good:
        body = request_options(opts.truncate, opts.prompt_name, opts.dimensions, opts.priority, opts.model)
        texts = [r.text for r in good if r.text is not None]  # all of them: the check narrows the type
        got, rejected, tokens = ivy.embed_rows(kind, texts, body)
        for i, (r, out) in enumerate(zip(good, got)):
            if i in rejected:
                errors.append(_error(r, rejected[i]))
            else:
                outputs.append(out)
                kept.append(r)
    return outputs, kept, errors, tokens


def _images(ivy: Ivy, opts: Options, rows: list[readers.Row]) -> tuple[list, list, list, int]:
    """The image rows, each file read just before its request, in requests
    of at most ``--image-request-bytes`` of base64 (row by row where Ivy
    rejects one): (outputs, their rows, error records, tokens). A file
    that cannot be read is its row's error, as is an image Ivy refuses."""
    body = request_options(opts.truncate, opts.prompt_name, opts.dimensions, opts.priority, opts.model)
    most = opts.image_request_bytes
    outputs: list = []
    kept: list[readers.Row] = []
    errors = [_error(r, r.bad) for r in rows if r.bad is not None]
    tokens = 0
    group: list[tuple[readers.Row, str]] = []
    size = 0

    def send() -> None:
        nonlocal tokens
        got, rejected, used = ivy.embed_rows("dense", [{"image": uri} for _, uri in group], body)
        tokens += used
        for i, ((r, _), out) in enumerate(zip(group, got)):
            if i in rejected:
                errors.append(_error(r, rejected[i]))
            else:
                outputs.append(out)
                kept.append(r)
        group.clear()

    for r in rows:
        if r.image is None:
            continue
        try:
            uri = images.item(r.image, most)
        except images.Unreadable as e:
            errors.append(_error(r, str(e)))
            continue
        if group and size + len(uri) > most:
            send()
            size = 0
        group.append((r, uri))
        size += len(uri)
    if group:
        send()
    return outputs, kept, errors, tokens


def images_unavailable(ivy: Ivy, options: dict) -> str | None:
    """Why the gateway cannot embed images with ``options`` (the requests'
    other fields), or None: one small PNG, sent before the run, so a
    text-only model is found before a file of bad rows, not after."""
    try:
        ivy.embed("dense", [{"image": images.data_uri(images.probe_png())}], options)
    except Rejected as e:
        return f"the gateway refused a small PNG (HTTP {e.status}): {e.message}"
    return None


def late_options(opts: Options) -> dict:
    """The body fields of a late-chunking request (``truncate`` is moot:
    Ivy windows a long document itself)."""
    return {**request_options(opts.truncate, opts.prompt_name, opts.dimensions, opts.priority, opts.model),
            "late_chunking": True}


def late_chunking_unavailable(ivy: Ivy, options: dict) -> str | None:
    """Why the gateway cannot late-chunk with ``options`` (the requests'
    other fields), or None. One small document, late-chunked and not: a
    gateway that refuses (a model whose head projects) or ignores the field
    (an Ivy from before it) is found before the work, not after a file of
    bad rows or of vectors that are not late-chunked."""
    texts = ["Berlin is the capital of Germany.", "The city has 3.8 million inhabitants."]
    try:
        late = ivy.embed("dense", texts, {**options, "late_chunking": True}).rows
        alone = ivy.embed("dense", texts[1:], options).rows
    except Rejected as e:
        return f"the gateway refused a small late-chunked document (HTTP {e.status}): {e.message}"
    if np.allclose(late[1], alone[0], atol=1e-6):
        return "the gateway answered the chunks embedded alone: it ignores `late_chunking` (an Ivy from before it?)"
    return None


def _late_chunks(ivy: Ivy, opts: Options, rows: list[readers.Row]) -> tuple[list, list, list, int]:
    """Each document of the batch in one late-chunking request, in turn:
    (outputs, their rows, error records, tokens). A document with a bad row,
    or one Ivy rejects, is bad as a whole: its chunks' vectors would be
    pooled from another document than the file holds."""
    body = late_options(opts)
    outputs: list = []
    kept: list[readers.Row] = []
    errors: list[dict] = []
    tokens = 0
    for doc in documents.split(rows):
        bad = next((r for r in doc if r.bad is not None), None)
        if bad is not None:
            why = f"its document has a bad row (row {readers.row_number(bad.index)}: {bad.bad})"
            errors += [_error(r, r.bad or why) for r in doc]
            continue
        try:
            res = ivy.embed("dense", [r.text for r in doc if r.text is not None], body)
        except Rejected as e:
            first, last = readers.row_number(doc[0].index), readers.row_number(doc[-1].index)
            why = (f"its document (rows {first}-{last}; input[0] is row {first}) was rejected by Ivy "
                   f"(HTTP {e.status}): {e.message}")
            errors += [_error(r, why) for r in doc]
            continue
        outputs += res.rows
        kept += doc
        tokens += res.tokens
    return outputs, kept, errors, tokens


def _error(row: readers.Row, reason: str) -> dict:
    # "row" is the row's number as the ids count it (readers.row_number).
    return {"row": readers.row_number(row.index), "line": row.line, "id": row.id, "error": reason}
