"""Late chunking in process (``RoseEmbedder(late_chunking=True)``), to
Ivy's rule (ivy/src/pipeline/late_chunk.rs; docs/api.md, "Late chunking"),
so a chunk's vector equals Ivy's: the chunks joined (one space between
two, none where either side has whitespace), the prompt before them, the
whole tokenized once; each token given to the chunk holding its last
character (special tokens and the prompt to the token before them, else the
first chunk); a document longer than the model in windows sharing a
quarter of their tokens, each token's state from the window where it is
furthest from an edge; each span pooled as the engine's ``span_pooling``
says, then ``dimensions`` and the model's normalization."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

# Python's isspace() also takes the ASCII separators 0x1C-0x1F; Rust's
# char::is_whitespace (Ivy's) does not.
_NOT_RUST_SPACE = "\x1c\x1d\x1e\x1f"


def _space(ch: str) -> bool:
    return ch.isspace() and ch not in _NOT_RUST_SPACE


def join(chunks: list[str]) -> tuple[str, list[int]]:
    """The document, and where each chunk's region ends in it (a joining
    space belongs to the chunk after it)."""
    doc, ends = "", []
    for i, c in enumerate(chunks):
        if i and not (doc and _space(doc[-1])) and not (c and _space(c[0])):
            doc += " "
        doc += c
        ends.append(len(doc))
    return doc, ends


def spans(offsets, special, at: int, ends: list[int]) -> list[tuple[int, int]]:
    """Each chunk's [start, end) of the tokens (character ``offsets`` in
    prompt + document, the prompt ``at`` characters long); ``ValueError``
    naming a chunk left with no token, in Ivy's words."""
    owners, current = [], 0
    for (s, e), sp in zip(offsets, special):
        if not sp and e > s and e > at and e - 1 - at < ends[-1]:
            current = max(current, min(bisect_right(ends, e - 1 - at), len(ends) - 1))
        owners.append(current)
    out = []
    for c in range(len(ends)):
        if c not in owners:
            raise ValueError(f"input[{c}] has no token of its own (it is only whitespace, or inside a token of the "
                             "chunk before it); join it to a neighbour")
        out.append((owners.index(c), len(owners) - owners[::-1].index(c)))
    return out


@dataclass
class Plan:
    """One document's sequences for the engine (the document, or its
    windows), the (sequence, row) each token's state comes from, and the
    chunks' token spans."""

    sequences: list[list[int]]
    source: list[tuple[int, int]]
    spans: list[tuple[int, int]]


def plan(tokenizer, prefix: str, chunks: list[str], max_length: int) -> Plan:
    """``tokenizer``: a ``tokenizers`` Tokenizer that neither truncates nor pads."""
    doc, ends = join(chunks)
    enc = tokenizer.encode(prefix + doc)
    ids, special = enc.ids, enc.special_tokens_mask
    chunk_spans = spans(enc.offsets, special, len(prefix), ends)
    n = len(ids)
    if n <= max_length:
        return Plan([ids], [(0, p) for p in range(n)], chunk_spans)
    pre = next((i for i, s in enumerate(special) if not s), n)
    suf = next((i for i, s in enumerate(reversed(special)) if not s), n)
    width = max_length - pre - suf
    if width <= 0 or pre + suf >= n:
        raise ValueError(f"a window of {max_length} tokens holds no text between the model's special tokens")
    body = ids[pre:n - suf]
    ranges, start, stride = [], 0, max(1, width - width // 4)
    while True:
        ranges.append((start, min(start + width, len(body))))
        if ranges[-1][1] >= len(body):
            break
        start += stride
    sequences = [ids[:pre] + body[a:z] + ids[n - suf:] for a, z in ranges]
    source = [(0, p) for p in range(pre)]
    first = 0
    for b in range(len(body)):
        while ranges[first][1] <= b:
            first += 1
        best, room = first, -1
        for k in range(first, len(ranges)):
            if ranges[k][0] > b:
                break
            r = min(b - ranges[k][0], ranges[k][1] - 1 - b)
            if r > room:  # ties go to the earlier window, as in Ivy
                best, room = k, r
        source.append((best, pre + b - ranges[best][0]))
    last = len(sequences) - 1
    source += [(last, len(sequences[last]) - suf + s) for s in range(suf)]
    return Plan(sequences, source, chunk_spans)


def pool(p: Plan, states: list[np.ndarray], mode: str, dim: int, normalize: bool) -> np.ndarray:
    """[chunks, dim] float32 from the sequences' token states ([len, hidden]
    each), in float64 as Ivy pools."""
    doc = np.stack([states[w][r] for w, r in p.source]).astype(np.float64)
    out = []
    for a, b in p.spans:
        rows = doc[a:b]
        if mode == "last":
            v = rows[-1]
        elif mode == "max":
            v = rows.max(0)
        else:
            w = np.arange(a + 1, b + 1, dtype=np.float64) if mode == "weightedmean" else np.ones(b - a)
            v = (w[:, None] * rows).sum(0) / (np.sqrt(w.sum()) if mode == "mean_sqrt_len" else w.sum())
        v = v[:dim]
        out.append(v / max(float(np.linalg.norm(v)), 1e-12) if normalize else v)
    return np.asarray(out, dtype=np.float32)


# The engine's span pooling → the pooling applied here: CLS-pooled models
# are mean-pooled over spans (a span has no [CLS] of its own).
MODES = {"mean": "mean", "cls": "mean", "mean_sqrt_len": "mean_sqrt_len", "max": "max",
         "weightedmean": "weightedmean", "last": "last"}
