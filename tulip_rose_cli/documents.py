"""Late chunking's documents (``--late-chunking --document-column``):
consecutive rows with one value in the document column are the chunks of
one document, in order; the run's batches hold whole documents.

A row with no document value (a line that is not JSON, the field missing)
stays with the document before it, which it makes bad: guessing where it
belongs could late-chunk a document without one of its chunks, a silently
wrong vector for each of the others."""

from __future__ import annotations

import dataclasses
import sys
from typing import Iterable, Iterator

from tulip_rose_cli.readers import Row


def split(rows: Iterable[Row], most: int = sys.maxsize) -> Iterator[list[Row]]:
    """The documents of ``rows``, in order. A document of more than
    ``most`` chunks (the gateway's inputs per request) is bad, every row of
    it, and comes in pieces of ``most + 1`` rows (the last may be shorter):
    a file whose document column is one value throughout is never held in
    memory whole."""
    doc: list[Row] = []
    key, started, over = None, False, False
    for r in rows:
        if started and (r.doc is None or r.doc == key):
            doc.append(r)
        else:
            if doc:
                yield _too_long(doc, most) if over else doc
            doc, key, started, over = [r], r.doc, True, False
        if len(doc) > most:
            over = True
            yield _too_long(doc, most)
            doc = []
    if doc:
        yield _too_long(doc, most) if over else doc


def _too_long(doc: list[Row], most: int) -> list[Row]:
    reason = (f"its document has more than {most} chunks, the gateway's limit of inputs per request "
              "(max_client_batch_size): split it into smaller documents")
    return [r if r.bad else dataclasses.replace(r, text=None, bad=reason) for r in doc]


def batches(docs: Iterable[list[Row]], size: int) -> Iterator[list[Row]]:
    """Whole documents packed into batches of at most ``size`` rows (a
    longer document is a batch of its own)."""
    batch: list[Row] = []
    for doc in docs:
        if batch and len(batch) + len(doc) > size:
            yield batch
            batch = []
        batch.extend(doc)
    if batch:
        yield batch
