"""Benchmark inputs: real text from ``tests/data/corpus/`` cut to exact token
counts with the model's own tokenizer, short real queries, and their ids."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "data" / "corpus"
# botchan.txt starts with Project Gutenberg's licence header.
_BOTCHAN_BODY_FROM = 60


@lru_cache(maxsize=None)
def lines(name: str) -> tuple[str, ...]:
    """Non-empty, stripped lines of a corpus file."""
    text = (CORPUS / name).read_text(encoding="utf-8-sig")
    return tuple(s for s in (line.strip() for line in text.splitlines()) if s)


def english_lines() -> list[str]:
    """English prose (the default model is English)."""
    return list(lines("botchan.txt")[_BOTCHAN_BODY_FROM:])


def mixed_lines() -> list[str]:
    """Every corpus line: English, 17 languages, adversarial lines."""
    return [*lines("calibration_miracl.txt"), *lines("calibration.txt"), *lines("botchan.txt")]


@lru_cache(maxsize=None)
def tokenizer(model_dir: str, max_length: int | None = None):
    """The model's ``tokenizer.json`` (Hugging Face ``tokenizers``), with no
    padding, truncating to ``max_length`` tokens when given."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tok.no_padding()
    if max_length:
        tok.enable_truncation(max_length)
    else:
        tok.no_truncation()
    return tok


def count(model_dir: str, text: str) -> int:
    """Tokens in ``text``, special tokens included."""
    return len(tokenizer(model_dir).encode(text).ids)


def text_of_tokens(model_dir: str, n: int, start: int = 0) -> str:
    """Real English text that tokenizes to exactly ``n`` tokens (special
    tokens included), taken from the corpus from line ``start`` on. Whole
    words are kept; if the last word overshoots, single-token filler words
    make up the difference."""
    tok = tokenizer(model_dir)
    src = english_lines()
    words: list[str] = []
    i = start
    while len(words) < 4 * n:
        words.extend(src[i % len(src)].split())
        i += 1
    lo, hi = 0, len(words)  # largest prefix of words with at most n tokens
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if len(tok.encode(" ".join(words[:mid])).ids) <= n:
            lo = mid
        else:
            hi = mid - 1
    text = " ".join(words[:lo])
    while (k := len(tok.encode(text).ids)) < n:
        text += " a" * (n - k)
    if len(tok.encode(text).ids) != n:
        raise RuntimeError(f"could not build a text of exactly {n} tokens")
    return text


def texts_of_tokens(model_dir: str, n: int, how_many: int) -> list[str]:
    """``how_many`` different texts of exactly ``n`` tokens each."""
    step = max(1, n // 8)
    return [text_of_tokens(model_dir, n, start=i * step) for i in range(how_many)]


def ids(model_dir: str, text: str, max_length: int | None = None) -> list[int]:
    """Token ids of ``text`` as the model's tokenizer gives them, truncated
    to ``max_length`` (special tokens kept) when given."""
    return tokenizer(model_dir, max_length).encode(text).ids


def queries(model_dir: str, how_many: int, lo: int = 10, hi: int = 64) -> list[str]:
    """Real English lines of ``lo``–``hi`` tokens: search-box-sized queries."""
    out = []
    for line in english_lines():
        if lo <= count(model_dir, line) <= hi:
            out.append(line)
            if len(out) == how_many:
                return out
    raise RuntimeError(f"the corpus has fewer than {how_many} lines of {lo}-{hi} tokens")
