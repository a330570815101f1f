"""Late chunking in process, the reference the served vectors are checked
against: ``transformers`` ``AutoModel`` on the model directory, one forward
pass over the whole document (chunks joined as the served path joins them),
each token given to the chunk its first character falls in ([CLS] to the
first chunk, [SEP] to the last), each chunk's token states mean-pooled and
L2-normalised. Chunks alone and queries are embedded the ordinary way: each
text alone, truncated to the window, mean pooling over its tokens (special
tokens included, as sentence-transformers pools), L2-normalised.

A document longer than ``window`` tokens is embedded in overlapping windows
(``windows``): each window is [CLS] + up to ``window - 2`` of the document's
tokens + [SEP], the next starting ``overlap`` tokens before the previous one
ended; a token seen by two windows takes its state from the earlier one in
the first half of the overlap and from the later one in the second half,
[CLS] from the first window and [SEP] from the last. Whether the served
path uses this same rule is not known here: the suite checks served against
reference at cosine >= 0.999 on documents that fit one window and reports
the longer ones apart. It expects a BERT-style model whose tokenizer wraps a
text in [CLS] ... [SEP] (all-MiniLM-L6-v2, the suite's model)."""

from __future__ import annotations

import numpy as np

from bench.harness import inputs

OVERLAP = 64


def windows(n: int, window: int, overlap: int = OVERLAP) -> list[tuple[int, int, int, int]]:
    """For a document of ``n`` tokens without its two special tokens, the
    windows as (start, end, keep_from, keep_to): the window covers tokens
    [start, end) and gives their states to [keep_from, keep_to)."""
    size = window - 2
    if n <= size:
        return [(0, n, 0, n)]
    if not 0 <= overlap < size:
        raise ValueError(f"overlap {overlap} must be below the window's {size} tokens")
    out, start = [], 0
    while True:
        end = min(start + size, n)
        keep_from = 0 if not out else out[-1][3]
        last = end == n
        keep_to = n if last else end - overlap + overlap // 2
        out.append((start, end, keep_from, keep_to))
        if last:
            return out
        start = end - overlap


def token_chunks(offsets: list[tuple[int, int]], special: list[int], starts: list[int]) -> np.ndarray:
    """Which chunk each token belongs to: the chunk whose text its first
    character falls in (``starts``: each chunk's first character in the
    document); a special token at the start goes to the first chunk, one
    at the end to the last."""
    out = np.empty(len(offsets), dtype=np.int64)
    for t, ((a, _), sp) in enumerate(zip(offsets, special)):
        if sp:
            out[t] = 0 if t == 0 else len(starts) - 1
        else:
            out[t] = int(np.searchsorted(starts, a, side="right")) - 1
    return out


def chunk_starts(chunks: list[str], document: str) -> list[int]:
    """Where each chunk begins in ``document`` (the chunks joined)."""
    out, pos = [], 0
    for c in chunks:
        i = document.index(c, pos)
        out.append(i)
        pos = i + len(c)
    return out


class Reference:
    """The model in process, float32 on the CPU."""

    def __init__(self, model_dir: str, threads: int, window: int, overlap: int = OVERLAP):
        import torch
        from transformers import AutoModel

        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModel.from_pretrained(model_dir).eval()
        self.tok = inputs.tokenizer(model_dir)  # no truncation, no padding
        self.window = window
        self.overlap = overlap
        self.cls, self.sep = self.tok.token_to_id("[CLS]"), self.tok.token_to_id("[SEP]")

    def _forward(self, ids: list[int]) -> np.ndarray:
        with self.torch.inference_mode():
            t = self.torch.tensor([ids])
            return self.model(input_ids=t, attention_mask=self.torch.ones_like(t)).last_hidden_state[0].numpy()

    def token_states(self, ids: list[int]) -> np.ndarray:
        """The last hidden state of every token of ``ids`` ([CLS] ... [SEP]),
        in windows when there are more than ``window``."""
        body = ids[1:-1]
        parts = windows(len(body), self.window, self.overlap)
        if len(parts) == 1:
            return self._forward(ids)
        states = np.empty((len(ids), self.model.config.hidden_size), dtype=np.float32)
        for k, (start, end, keep_from, keep_to) in enumerate(parts):
            h = self._forward([self.cls, *body[start:end], self.sep])
            states[1 + keep_from:1 + keep_to] = h[1 + keep_from - start:1 + keep_to - start]
            if k == 0:
                states[0] = h[0]
            if k == len(parts) - 1:
                states[-1] = h[-1]
        return states

    def late(self, chunks: list[str], document: str) -> tuple[np.ndarray, int]:
        """One vector per chunk from one pass over ``document``; and the
        document's length in tokens."""
        enc = self.tok.encode(document)
        owner = token_chunks(enc.offsets, enc.special_tokens_mask, chunk_starts(chunks, document))
        states = self.token_states(enc.ids)
        out = np.zeros((len(chunks), states.shape[1]), dtype=np.float32)
        for i in range(len(chunks)):
            mine = owner == i
            if not mine.any():
                raise ValueError(f"chunk {i} of the document has no token of its own: {chunks[i]!r}")
            out[i] = states[mine].mean(axis=0)
        return _normalised(out), len(enc.ids)

    def alone(self, texts: list[str]) -> np.ndarray:
        """Each text embedded on its own (truncated to the window)."""
        out = []
        for t in texts:
            ids = self.tok.encode(t).ids
            if len(ids) > self.window:
                ids = [*ids[:self.window - 1], self.sep]
            out.append(self._forward(ids).mean(axis=0))
        return _normalised(np.array(out, dtype=np.float32))


def _normalised(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)
