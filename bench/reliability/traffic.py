"""The soak's mixed traffic: what each kind of request sends and which
status it must get. A kind is drawn per request by weight and builds fresh
request bytes (for ``HttpClient``): batches are new random samples of the
corpus every time, so the replicas see ever new ragged shapes, as in
production."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Callable

from bench.harness import inputs


@dataclass(frozen=True)
class Kind:
    """One kind of request: where it goes (``"embed"`` or ``"rerank"``
    gateway), how to build one from a random generator, and the one status
    it must get."""

    name: str
    gateway: str
    weight: float
    expect: int
    make: Callable[[random.Random], bytes]


def raw_post(host: str, port: int, path: str, body: bytes, content_type: str = "application/json") -> bytes:
    """Request bytes with any body (``HttpClient.prepare`` only writes JSON)."""
    head = (f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


def _post(port: int, path: str, payload) -> bytes:
    return raw_post("127.0.0.1", port, path, json.dumps(payload).encode())


# Bad requests and the status Ivy documents for each (ivy/src/error.rs:
# OpenAI family on /v1/*, TEI family elsewhere).
def bad_requests(port: int, vocab: int, max_inputs: int) -> list[bytes]:
    """(request bytes) each of which must be refused with 4xx; the exact
    status is in ``BAD_STATUS`` order."""
    return [raw_post("127.0.0.1", port, "/v1/embeddings", b'{"input": ["unterminated"'),  # 400
            _post(port, "/v1/embeddings", {"input": []}),  # 422
            _post(port, "/v1/embeddings", {"input": [[vocab + 5]]}),  # 422
            _post(port, "/v1/embeddings", {"input": ["x"] * (max_inputs + 1)}),  # 422
            _post(port, "/v1/embeddings", {"input": "x", "model": "no-such-model"}),  # 404
            raw_post("127.0.0.1", port, "/v1/embeddings", b'{"input": "x"}', "text/plain"),  # 415
            _post(port, "/embed", {"inputs": []}),  # 400 (TEI "Empty")
            _post(port, "/rerank", {"query": "q", "texts": ["t"]})]  # 424: MiniLM has no score head


BAD_STATUS = (400, 422, 422, 422, 404, 415, 400, 424)


def kinds(model_dir: str, embed_port: int, rerank_port: int | None, vocab: int, max_inputs: int,
          bad_fraction: float = 0.05) -> list[Kind]:
    """The soak's mix: single queries, 100-document batches, token-id
    inputs, rerank (on the cross-encoder gateway when there is one) and
    ``bad_fraction`` bad requests, each bad kind weighted alike."""
    queries = inputs.queries(model_dir, 200)
    query_ids = [inputs.ids(model_dir, q) for q in queries]
    docs = inputs.english_lines()
    good = 1.0 - bad_fraction
    out = [Kind("query", "embed", 0.55 * good, 200,
                lambda rng: _post(embed_port, "/v1/embeddings", {"input": rng.choice(queries)})),
           Kind("batch100", "embed", 0.10 * good, 200,
                lambda rng: _post(embed_port, "/v1/embeddings", {"input": rng.sample(docs, 100)})),
           Kind("token_ids", "embed", 0.15 * good, 200,
                lambda rng: _post(embed_port, "/v1/embeddings", {"input": rng.sample(query_ids, 8)})),
           Kind("tei_embed", "embed", 0.10 * good, 200,
                lambda rng: _post(embed_port, "/embed", {"inputs": rng.sample(queries, 4), "truncate": True}))]
    if rerank_port:
        out.append(Kind("rerank", "rerank", 0.10 * good, 200, lambda rng: _post(
            rerank_port, "/rerank", {"query": rng.choice(queries), "texts": rng.sample(docs, 10), "truncate": True})))
    bad = bad_requests(embed_port, vocab, max_inputs)
    out += [Kind(f"bad_{status}_{i}", "embed", bad_fraction / len(bad), status, lambda rng, req=req: req)
            for i, (req, status) in enumerate(zip(bad, BAD_STATUS))]
    return out


def drawer(all_kinds: list[Kind], seed: int = 1):
    """A function returning (kind, request bytes) drawn by weight."""
    rng = random.Random(seed)
    weights = [k.weight for k in all_kinds]

    def draw() -> tuple[Kind, bytes]:
        k = rng.choices(all_kinds, weights)[0]
        return k, k.make(rng)
    return draw
