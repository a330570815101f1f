"""Input files as a stream of rows: text (a document per line), JSONL (a
field), CSV/TSV (a column) and Parquet (a column).

Every data row of the file becomes one ``Row``, in file order, good or bad:
a row that cannot be sent (empty, not UTF-8, not valid JSON, the field
missing or not a string) carries the reason instead of a text, so row
positions never shift and bad rows can be reported by line.

Row numbers, one rule for every format: a row's number is its position
among the data rows, counted from 1 (a CSV/TSV header is not a data row).
Without an id column a row's id is its number, and the errors file's "row"
is the same number; its "line" is where the row starts in the file (for
text and JSONL the same as the number; none for Parquet).

With a document column (late chunking), each row also carries its
document's value; a row without one is bad.

With an image column (``--image-column``) the column is read instead of the
text: each row carries its image (``Row.image``): a file path, resolved
against the input file's directory and read later, by the worker that sends
its batch; a Parquet binary value's bytes; or a data URI or http(s) URL,
sent as given. Bare base64 is not read (it cannot be told from a file
name): it must be a data URI."""

from __future__ import annotations

import csv
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

FORMATS = ("text", "jsonl", "csv", "tsv", "parquet")
_BY_SUFFIX = {".txt": "text", ".text": "text", ".jsonl": "jsonl", ".ndjson": "jsonl",
              ".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".parquet": "parquet", ".pq": "parquet"}


class InputError(Exception):
    """The input cannot be read as asked (a missing column, a wrong format)."""


@dataclass(frozen=True)
class Row:
    """One data row: ``index`` counts data rows from 0 (its number is
    ``row_number(index)``), ``line`` is the 1-based line of the file it
    starts on (None for Parquet), ``id`` the value of the id column, or the
    row's number when no id column is given. Exactly one of ``text``,
    ``image`` and ``bad`` is set. ``doc`` is the document column's value
    (None without one, or where the row has none). ``image`` is a file's
    absolute path (read when its batch is sent), the image's bytes, or a
    data URI or URL sent as given (the module's docstring)."""

    index: int
    line: int | None
    id: object
    text: str | None = None
    bad: str | None = None
    doc: object = None
    image: Path | str | bytes | None = None


DEFAULT_COLUMN = "text"


def row_number(index: int) -> int:
    """The number of the data row at 0-based ``index``: the default id and
    the errors file's "row", in every format."""
    return index + 1


def text_column(fmt: str, column: str | None) -> str | None:
    """The field or column the texts are read from (None for text files)."""
    return None if fmt == "text" else column or DEFAULT_COLUMN


def detect_format(path: Path, given: str | None) -> str:
    if given:
        return given
    fmt = _BY_SUFFIX.get(path.suffix.lower())
    if fmt is None:
        raise InputError(f"cannot tell the format of {path} from its suffix; pass --format "
                         f"({', '.join(FORMATS)})")
    return fmt


def fingerprint(path: Path) -> dict:
    """What identifies the input for a resumed run: a file that changed
    (size or modification time) must not be resumed."""
    st = os.stat(path)
    return {"path": str(path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def check_text(text: str) -> str | None:
    """Why a decoded text cannot be embedded, or None."""
    if not text.strip():
        return "empty"
    # surrogateescape keeps undecodable bytes as lone surrogates.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "not UTF-8"
    return None


def image_value(v, where: str, base: Path) -> dict:
    """The ``Row`` fields (``image`` or ``bad``) of an image column's value
    ``v`` (``where`` names the column in a reason); ``base`` is the
    directory relative paths start from."""
    if isinstance(v, (bytes, bytearray, memoryview)):
        return {"image": bytes(v)} if len(v) else {"bad": "empty"}
    if not isinstance(v, str):
        return {"bad": f"{where} is not a string (a file path, data URI or URL) or bytes"}
    s = v.strip()
    bad = check_text(s)
    if bad:
        return {"bad": bad}
    if s.startswith(("data:", "http://", "https://")):
        return {"image": s}
    # An absolute path replaces base.
    return {"image": base / Path(s).expanduser()}


def _text_rows(path: Path) -> Iterator[Row]:
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            line = num = row_number(i)
            raw = raw.rstrip(b"\n").rstrip(b"\r")
            if i == 0 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                yield Row(i, line, num, bad="not UTF-8")
                continue
            bad = check_text(text)
            yield Row(i, line, num, None if bad else text, bad)


def _jsonl_rows(path: Path, field: str, id_field: str | None, doc_field: str | None,
                images: Path | None) -> Iterator[Row]:
    with open(path, "rb") as f:
        for i, raw in enumerate(f):
            line = i + 1
            fallback = row_number(i)
            try:
                obj = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                yield Row(i, line, fallback, bad="not UTF-8")
                continue
            except ValueError as e:
                yield Row(i, line, fallback, bad="empty" if not raw.strip() else f"not JSON: {e}")
                continue
            if not isinstance(obj, dict):
                yield Row(i, line, fallback, bad="not a JSON object")
                continue
            rid = _id_value(obj.get(id_field)) if id_field else fallback
            if id_field and rid is None:
                yield Row(i, line, fallback, bad=f"no id field {id_field!r}")
                continue
            doc = _id_value(obj.get(doc_field)) if doc_field else None
            text = obj.get(field)
            if doc_field and doc is None:
                yield Row(i, line, rid, bad=f"no document field {doc_field!r}")
            elif text is None:
                yield Row(i, line, rid, bad=f"no field {field!r}", doc=doc)
            elif images is not None:
                yield Row(i, line, rid, doc=doc, **image_value(text, f"field {field!r}", images))
            elif not isinstance(text, str):
                yield Row(i, line, rid, bad=f"field {field!r} is not a string", doc=doc)
            else:
                bad = check_text(text)
                yield Row(i, line, rid, None if bad else text, bad, doc)


def _id_value(v):
    """Ids are kept as strings (a column may mix numbers and strings); a
    missing id is None."""
    if v is None:
        return None
    return v if isinstance(v, str) else json.dumps(v)


def _csv_rows(path: Path, delimiter: str, column: str, id_column: str | None,
              doc_column: str | None, images: Path | None) -> Iterator[Row]:
    # Documents can be far longer than the csv module's 128 KiB field limit.
    csv.field_size_limit(2**31 - 1)
    with open(path, encoding="utf-8", errors="surrogateescape", newline="") as f:
        if f.read(1) != "\ufeff":
            f.seek(0)
        reader = csv.reader(f, delimiter=delimiter)
        header = next(reader, None)
        if header is None:
            return
        for name in filter(None, (column, id_column, doc_column)):
            if name not in header:
                raise InputError(_no_column(path, name, column, header))
        col, id_col = header.index(column), header.index(id_column) if id_column else None
        doc_col = header.index(doc_column) if doc_column else None
        start = reader.line_num + 1
        for i, record in enumerate(_records(reader, path)):
            line = start
            start = reader.line_num + 1
            num = row_number(i)
            rid: int | str | None = num  # the id column's text, where there is one
            if id_col is not None:
                rid = record[id_col] if id_col < len(record) else None
                if rid is None or check_text(rid) == "not UTF-8":
                    yield Row(i, line, num, bad="no id" if rid is None else "id not UTF-8")
                    continue
            doc = None
            if doc_col is not None:
                doc = record[doc_col] if doc_col < len(record) else None
                if doc is None or check_text(doc) == "not UTF-8":
                    yield Row(i, line, rid, bad="no document value" if doc is None else "document value not UTF-8")
                    continue
            if col >= len(record):
                yield Row(i, line, rid, bad=f"no column {column!r} in this record", doc=doc)
                continue
            if images is not None:
                yield Row(i, line, rid, doc=doc, **image_value(record[col], f"column {column!r}", images))
                continue
            bad = check_text(record[col])
            yield Row(i, line, rid, None if bad else record[col], bad, doc)


def _records(reader, path: Path):
    """The csv reader's records, its errors (a NUL byte, an unclosed quote
    in strict mode) naming the file and line."""
    try:
        yield from reader
    except csv.Error as e:
        raise InputError(f"{path}, line {reader.line_num}: {e}") from None


def _parquet_rows(path: Path, column: str, id_column: str | None, doc_column: str | None,
                  images: Path | None) -> Iterator[Row]:
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(path)
    names = pf.schema_arrow.names
    for name in filter(None, (column, id_column, doc_column)):
        if name not in names:
            raise InputError(_no_column(path, name, column, names))
    i = 0
    wanted = list(dict.fromkeys(c for c in (column, id_column, doc_column) if c))
    # Image bytes are big: fewer rows are read at a time.
    for batch in pf.iter_batches(columns=wanted, batch_size=4096 if images is None else 64):
        texts = batch.column(column).to_pylist()
        ids = batch.column(id_column).to_pylist() if id_column else None
        docs = batch.column(doc_column).to_pylist() if doc_column else None
        for j, text in enumerate(texts):
            rid = _id_value(ids[j]) if ids else row_number(i)
            doc = _id_value(docs[j]) if docs else None
            if rid is None:
                yield Row(i, None, row_number(i), bad="no id")
            elif docs and doc is None:
                yield Row(i, None, rid, bad="no document value")
            elif text is None:
                yield Row(i, None, rid, bad="empty", doc=doc)
            elif images is not None:
                yield Row(i, None, rid, doc=doc, **image_value(text, f"column {column!r}", images))
            elif not isinstance(text, str):
                yield Row(i, None, rid, bad=f"column {column!r} is not a string", doc=doc)
            else:
                bad = check_text(text)
                yield Row(i, None, rid, None if bad else text, bad, doc)
            i += 1


def _no_column(path: Path, name: str, column: str, names: list) -> str:
    default = " (the default of --column)" if name == column == DEFAULT_COLUMN else ""
    return f"{path} has no column {name!r}{default}; its columns are {names}"


def check(path: Path, fmt: str, column: str | None, id_column: str | None, doc_column: str | None = None,
          image_column: str | None = None) -> None:
    """Raises ``InputError`` when ``path`` cannot be read with these options
    (a missing column, an id column on a text file), before a run writes
    anything: the reader checks its header before the first row."""
    next(iter(rows(path, fmt, column, id_column, doc_column, image_column)), None)


def rows(path: Path, fmt: str, column: str | None, id_column: str | None,
         doc_column: str | None = None, image_column: str | None = None) -> Iterator[Row]:
    """Every data row of ``path`` in order. ``column`` names the text field
    (JSONL) or column (CSV/TSV/Parquet; default ``text``); ``id_column``
    the ids (default: the rows' numbers, see the module's docstring);
    ``doc_column`` the documents' values, kept as strings as ids are;
    ``image_column``, given, is read instead of the text (``Row.image``)."""
    images = None
    if image_column is not None:
        if fmt == "text":
            raise InputError("a text file has no columns, so no image column: use JSONL, CSV/TSV or Parquet "
                             "with a column of image paths (or Parquet image bytes)")
        column, images = image_column, path.resolve().parent
    column = column or DEFAULT_COLUMN
    if doc_column is not None and doc_column == column:
        raise InputError(f"the document column and the text column are both {column!r}")
    if fmt == "text":
        if id_column:
            raise InputError("a text file has no id column: use JSONL, CSV/TSV or Parquet for ids")
        if doc_column:
            raise InputError("a text file has no columns, so no document column: use JSONL, CSV/TSV or Parquet "
                             "with a column naming each row's document")
        return _text_rows(path)
    if fmt == "jsonl":
        return _jsonl_rows(path, column, id_column, doc_column, images)
    if fmt in ("csv", "tsv"):
        return _csv_rows(path, "," if fmt == "csv" else "\t", column, id_column, doc_column, images)
    if fmt == "parquet":
        return _parquet_rows(path, column, id_column, doc_column, images)
    raise InputError(f"unknown format {fmt!r}; one of {', '.join(FORMATS)}")


def count(path: Path, fmt: str) -> int | None:
    """Rows in the file, for the progress bar's ETA (CSV: lines minus the
    header, an upper bound when quoted fields hold newlines)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            n += block.count(b"\n")
            last = block[-1:]
    n += last != b"\n"
    return max(0, n - 1) if fmt in ("csv", "tsv") else n
