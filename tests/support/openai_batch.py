"""The Batch API through the official ``openai`` client, as the tests use
it: input lines, a corpus of them, submitting a file as a batch, waiting for
its end, and reading an output file's lines."""

from __future__ import annotations

import json
import time

import openai

KEYS = ("alpha-key", "beta-key")
TEXTS = ["What is an embedding?", "Berlin is the capital of Germany.", "A cat sat on the mat.",
         "Vector search finds the nearest neighbours of a query.", "short", "Ünïcödé text, ok?"]


def line(custom_id: str, body: dict, url: str = "/v1/embeddings") -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body}) + "\n"


def corpus(n: int, prefix: str = "r") -> str:
    return "".join(line(f"{prefix}{i}", {"input": f"{TEXTS[i % len(TEXTS)]} ({i})"}) for i in range(n))


def client(ivy, key: str = KEYS[0]):
    return openai.OpenAI(base_url=ivy.url + "/v1", api_key=key, max_retries=0)


def submit(c, text: str, **extra):
    f = c.files.create(file=("requests.jsonl", text.encode()), purpose="batch")
    return f, c.batches.create(input_file_id=f.id, endpoint="/v1/embeddings", completion_window="24h", **extra)


def wait_done(c, batch_id: str, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        b = c.batches.retrieve(batch_id)
        if b.status in ("completed", "failed", "expired", "cancelled"):
            return b
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} still {b.status} after {timeout} s: {b}")


def jsonl(c, file_id: str | None) -> list[dict]:
    if file_id is None:
        return []
    return [json.loads(x) for x in c.files.content(file_id).text.splitlines()]


def assert_every_line_once(c, done, prefix: str, n: int) -> None:
    """A batch of ``corpus(n, prefix)`` completed with every ``custom_id``
    in its output exactly once and none failed."""
    assert done.status == "completed", done
    ids = [o["custom_id"] for o in jsonl(c, done.output_file_id)]
    assert len(ids) == n and set(ids) == {f"{prefix}{i}" for i in range(n)}
    assert done.request_counts.completed == n and done.request_counts.failed == 0
