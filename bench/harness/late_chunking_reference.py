"""Late chunking in process, the reference served vectors are checked
against (the benchmark and tests/e2e/test_late_chunking.py), written from
``transformers`` token states independently of Ivy's code, to the rule
docs/api.md states: chunks joined into the document (a space between two
chunks unless one side has whitespace), tokenized once with the model's own
tokenizer, each token given to the chunk holding its last character
(specials and the prompt to the chunk before them, else the first); a
document longer than the window is cut into windows sharing a quarter of
their tokens, each token's state read from the window where it is furthest
from an edge; each chunk's states mean-pooled (or its last one, for
last-token models)."""

from __future__ import annotations

from bisect import bisect_right

import numpy as np
import torch


def join(chunks: list[str]) -> tuple[str, list[int]]:
    doc, ends = "", []
    for i, c in enumerate(chunks):
        if i and not doc[-1:].isspace() and not c[:1].isspace():
            doc += " "
        doc += c
        ends.append(len(doc))
    return doc, ends


def spans(enc, prefix_chars: int, ends: list[int]) -> list[tuple[int, int]]:
    """Each chunk's [start, end) token span in ``enc`` (a ``tokenizers``
    encoding of prompt + document, char offsets)."""
    owner, current = [], 0
    for (s, e), special in zip(enc.offsets, enc.special_tokens_mask):
        if not special and e > s and e > prefix_chars:
            last = e - 1 - prefix_chars
            if last < ends[-1]:
                current = max(current, min(bisect_right(ends, last), len(ends) - 1))
        owner.append(current)
    out = []
    for c in range(len(ends)):
        where = [p for p, o in enumerate(owner) if o == c]
        out.append((where[0], where[-1] + 1))
    return out


@torch.inference_mode()
def _hidden(auto_model, ids: list[int]) -> np.ndarray:
    t = torch.tensor([ids])
    return auto_model(input_ids=t, attention_mask=torch.ones_like(t)).last_hidden_state[0].float().numpy()


def token_states(auto_model, ids: list[int], special: list[int], max_length: int) -> np.ndarray:
    """[n, H]: one forward when the document fits, else windows."""
    n = len(ids)
    if n <= max_length:
        return _hidden(auto_model, ids)
    pre = next(i for i, s in enumerate(special) if not s)
    suf = next(i for i, s in enumerate(reversed(special)) if not s)
    head, body, tail = ids[:pre], ids[pre:n - suf], ids[n - suf:]
    width = max_length - pre - suf
    stride = width - width // 4
    ranges, start = [], 0
    while True:
        ranges.append((start, min(start + width, len(body))))
        if ranges[-1][1] >= len(body):
            break
        start += stride
    states = [_hidden(auto_model, head + body[a:b] + tail) for a, b in ranges]
    rows = [states[0][p] for p in range(pre)]
    for b in range(len(body)):
        k = max((k for k, (a, z) in enumerate(ranges) if a <= b < z),
                key=lambda k: (min(b - ranges[k][0], ranges[k][1] - 1 - b), -k))
        rows.append(states[k][pre + b - ranges[k][0]])
    rows += [states[-1][len(states[-1]) - suf + s] for s in range(suf)]
    return np.stack(rows)


def tokenizer(st):
    """A copy of the model's ``tokenizers`` object (char offsets, specials
    mask) that neither truncates nor pads."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_str(st.tokenizer.backend_tokenizer.to_str())
    tok.no_truncation()
    tok.no_padding()
    return tok


def late_chunks(st, chunks: list[str], pooling: str, max_length: int, prompt: str = "") -> np.ndarray:
    """One vector per chunk (not normalized) from a SentenceTransformer's
    tokenizer and transformer."""
    return _late(st, chunks, pooling, max_length, prompt)[0]


def _late(st, chunks: list[str], pooling: str, max_length: int, prompt: str = "") -> tuple[np.ndarray, int]:
    doc, ends = join(chunks)
    enc = tokenizer(st).encode(prompt + doc)
    states = token_states(st[0].auto_model, enc.ids, enc.special_tokens_mask, max_length)
    out = []
    for a, b in spans(enc, len(prompt), ends):
        out.append(states[b - 1] if pooling == "last" else states[a:b].mean(0))
    return np.stack(out), len(enc.ids)


class Reference:
    """A mean-pooled model (the benchmark's MiniLM) in process, float32 on
    the CPU: late chunks over ``window``-token windows, and texts alone as
    sentence-transformers embeds them; both L2-normalised."""

    def __init__(self, model_dir: str, threads: int, window: int):
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self.st = SentenceTransformer(model_dir, device="cpu")
        self.window = window

    def late(self, chunks: list[str], document: str | None = None) -> tuple[np.ndarray, int]:
        """One vector per chunk, and the document's length in tokens;
        ``document``, when given, must be the chunks joined."""
        if document is not None and join(chunks)[0] != document:
            raise ValueError("the document is not its chunks joined as the served path joins them")
        vectors, n = _late(self.st, chunks, "mean", self.window)
        return _normalised(vectors), n

    def alone(self, texts: list[str]) -> np.ndarray:
        return self.st.encode(texts, normalize_embeddings=True, batch_size=32)


def _normalised(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
