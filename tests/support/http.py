"""The tests' HTTP calls to Ivy beyond ``Ivy.request`` and ``Ivy.post_json``:
raw bodies (malformed JSON, wrong content types), JSON GETs, embeddings as
arrays, and the check that Ivy still serves after a refused request."""

from __future__ import annotations

import json

import numpy as np


def raw(ivy, path: str, data: bytes, content_type: str | None = "application/json") -> tuple[int, object]:
    """POSTs ``data`` as it is; (status, the answer parsed as JSON)."""
    headers = {"Content-Type": content_type} if content_type else {}
    status, _, body = ivy.request("POST", path, data, headers)
    return status, json.loads(body)


def get_json(ivy, path: str) -> tuple[int, object]:
    status, body = ivy.get(path)
    return status, json.loads(body)


def embeddings_reply(ivy, texts, **fields) -> dict:
    """The 200 answer of ``/v1/embeddings`` for ``texts`` (a string, or a list
    of strings or token id lists), its rows checked to be in input order."""
    status, body = ivy.post_json("/v1/embeddings", {"input": texts, **fields})
    assert status == 200, body
    n = 1 if isinstance(texts, str) else len(texts)
    assert [d["index"] for d in body["data"]] == list(range(n))
    return body


def embed(ivy, texts, **fields) -> np.ndarray:
    """``/v1/embeddings`` of ``texts`` as a float32 array, one row per input."""
    return vectors(embeddings_reply(ivy, texts, **fields))


def vectors(reply: dict) -> np.ndarray:
    return np.array([d["embedding"] for d in reply["data"]], dtype=np.float32)


def still_serving(ivy, path: str, payload: dict) -> None:
    """Fails unless ``payload`` on ``path`` gets a 200 (run after each test
    that sends a bad request)."""
    status, body = ivy.post_json(path, payload)
    assert status == 200, f"Ivy stopped serving after a bad request: {body}"
