"""The late-chunking retrieval dataset (``bench/data/late_chunking/``):
documents of consecutive lines of ``tests/data/corpus/botchan.txt``, cut
into chunks of one or a few sentences, and hand-written questions whose
answer is in one chunk while the entity they name is only in another chunk
of the same document. ``dataset.json`` records line ranges and a checksum
of each document's chunks, never the text: the text is read from the corpus
and cut by the rule below, the same on every run.

``python -m bench.harness.late_chunking_dataset`` prints every document's
chunks, numbered (what the questions were written from), and its length in
MiniLM tokens; ``--check`` checks the dataset and exits non-zero on a fault."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bench.harness.inputs import CORPUS

DATA_DIR = Path(__file__).resolve().parents[1] / "data" / "late_chunking"
DATASET = DATA_DIR / "dataset.json"
SOURCE = CORPUS / "botchan.txt"

# A sentence ends at . ! or ? (closing quotes or a bracket may follow) before
# a space and a capital letter or an opening quote; not after these
# abbreviations or a single capital initial ("Mr. K. Natsume").
_END = re.compile(r"""[.!?]["')]*(?= ["'(]?[A-Z])""")
_ABBREVIATIONS = ("Mr.", "Mrs.", "Dr.", "St.", "Messrs.")
# A piece of fewer words joins the sentence before it ("... cut!" I retorted.).
MIN_WORDS = 6


@lru_cache(maxsize=1)
def source_lines() -> tuple[str, ...]:
    """botchan.txt's lines (BOM and line ends dropped); line n is [n - 1]."""
    return tuple(SOURCE.read_text(encoding="utf-8-sig").splitlines())


def document_text(first: int, last: int) -> str:
    """Lines ``first``..``last`` (1-based, inclusive) as one paragraph: every
    run of whitespace, line breaks included, becomes one space."""
    return " ".join(" ".join(source_lines()[first - 1:last]).split())


def _sentence_ends(text: str) -> list[int]:
    ends = []
    for m in _END.finditer(text):
        start = text.rfind(" ", 0, m.start()) + 1
        word = text[start:m.start() + 1]
        if word in _ABBREVIATIONS or re.fullmatch(r"[A-Z]\.", word):
            continue
        ends.append(m.end())
    return ends


def chunk(text: str) -> list[str]:
    """``text`` cut into sentences, a piece of fewer than ``MIN_WORDS`` words
    joined to the one before it (the first to the one after it). Joined with
    one space, the chunks are ``text`` again."""
    pieces, start = [], 0
    for end in [*_sentence_ends(text), len(text)]:
        if end > start:
            pieces.append(text[start:end].strip())
            start = end
    pieces = [p for p in pieces if p]
    out: list[str] = []
    for p in pieces:
        if out and (len(p.split()) < MIN_WORDS or len(out[-1].split()) < MIN_WORDS):
            out[-1] = f"{out[-1]} {p}"
        else:
            out.append(p)
    return out


def join(chunks: list[str]) -> str:
    """The document the served late-chunking path embeds: chunks joined
    with one space, unless a chunk already ends (or the next begins) with
    whitespace, then as they are."""
    doc = ""
    for i, c in enumerate(chunks):
        if i and not (doc[-1:].isspace() or c[:1].isspace()):
            doc += " "
        doc += c
    return doc


def checksum(chunks: list[str]) -> str:
    return hashlib.sha256("\n".join(chunks).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Document:
    id: str
    lines: tuple[int, int]
    chunks: tuple[str, ...]

    @property
    def text(self) -> str:
        return join(list(self.chunks))


@dataclass(frozen=True)
class Question:
    id: str
    text: str
    doc: str
    chunk: int
    entity: str
    answer: str


@dataclass(frozen=True)
class Dataset:
    documents: tuple[Document, ...]
    questions: tuple[Question, ...]

    def pool(self) -> list[tuple[str, int]]:
        """(document id, chunk index) of every chunk, in order: the
        retrieval pool."""
        return [(d.id, i) for d in self.documents for i in range(len(d.chunks))]

    def subset(self, ids: list[str]) -> Dataset:
        """These documents and their questions (the quick mode)."""
        keep = tuple(d for d in self.documents if d.id in ids)
        return Dataset(keep, tuple(q for q in self.questions if q.doc in ids))


def build(spec: dict) -> Dataset:
    docs = tuple(Document(d["id"], tuple(d["lines"]), tuple(chunk(document_text(*d["lines"]))))
                 for d in spec["documents"])
    questions = tuple(Question(q["id"], q["question"], q["doc"], q["chunk"], q["entity"], q["answer"])
                      for q in spec["questions"])
    return Dataset(docs, questions)


@lru_cache(maxsize=1)
def _spec() -> dict:
    return json.loads(DATASET.read_text(encoding="utf-8"))


def load() -> Dataset:
    return build(_spec())


def _has(text: str, word: str) -> bool:
    """``word`` in ``text`` as a whole word (or phrase), any case."""
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text, re.I) is not None


def faults(spec: dict | None = None) -> list[str]:
    """What is wrong with the dataset, one line per fault: a corpus file
    that changed, a document whose chunks changed (count, checksum), a target chunk that does not exist, does
    not hold the answer or names the question's entity, an entity that the
    question does not name or no other chunk of the document names."""
    spec = spec or _spec()
    data = build(spec)
    out = []
    by_id = {d.id: d for d in data.documents}
    if len(by_id) != len(data.documents):
        out.append("document ids repeat")
    if hashlib.sha256(SOURCE.read_bytes()).hexdigest() != spec["source_sha256"]:
        out.append(f"{SOURCE.name} is not the file the dataset was built from (sha256)")
    for d, s in zip(data.documents, spec["documents"]):
        if len(d.chunks) != s["chunks"]:
            out.append(f"{d.id}: {len(d.chunks)} chunks, recorded {s['chunks']}")
        if checksum(list(d.chunks)) != s["sha256"]:
            out.append(f"{d.id}: chunks changed (sha256 {checksum(list(d.chunks))}, recorded {s['sha256']})")
        if d.text != document_text(*d.lines):
            out.append(f"{d.id}: joined chunks differ from the document's text")
    for q in data.questions:
        d = by_id.get(q.doc)
        if d is None or not 0 <= q.chunk < len(d.chunks):
            out.append(f"{q.id}: no chunk {q.doc}#{q.chunk}")
            continue
        target = d.chunks[q.chunk]
        if not _has(q.text, q.entity):
            out.append(f"{q.id}: the question does not name its entity {q.entity!r}")
        if _has(target, q.entity):
            out.append(f"{q.id}: the target chunk names the entity {q.entity!r}")
        if not any(_has(c, q.entity) for i, c in enumerate(d.chunks) if i != q.chunk):
            out.append(f"{q.id}: no other chunk of {q.doc} names {q.entity!r}")
        if q.answer.lower() not in target.lower():
            out.append(f"{q.id}: the answer {q.answer!r} is not in the target chunk")
    if len({q.id for q in data.questions}) != len(data.questions):
        out.append("question ids repeat")
    return out


def _show() -> None:
    from bench.harness import inputs
    from tulip_rose_cli.launch import default_model_dir

    model = default_model_dir()
    for d in load().documents:
        print(f"== {d.id} lines {d.lines[0]}-{d.lines[1]}: {len(d.chunks)} chunks, "
              f"{inputs.count(model, d.text)} tokens, sha256 {checksum(list(d.chunks))}")
        for i, c in enumerate(d.chunks):
            print(f"[{i}] {c}")


if __name__ == "__main__":
    if "--check" in sys.argv:
        problems = faults()
        print("\n".join(problems) or "ok")
        sys.exit(1 if problems else 0)
    _show()
