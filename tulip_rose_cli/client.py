"""Ivy's HTTP API as the bulk command uses it: one keep-alive connection per
worker thread, retries with exponential backoff and jitter on what a later
attempt can cure (429, 502-504, connection errors, timeouts), and a typed error
for what it cannot (a rejected batch, a bad key)."""

from __future__ import annotations

import base64
import http.client
import json
import random
import threading
import time
from dataclasses import dataclass
from typing import Sequence, Union
from urllib.parse import quote, urlsplit

import numpy as np

# Statuses a later attempt can cure: overloaded, an upstream failure, no
# healthy replica or draining, a gateway timeout. (A 500 is Ivy's own bug:
# retrying would only repeat it.)
RETRYABLE = frozenset({429, 502, 503, 504})
# Statuses that blame the request's content: some row in it is bad (415:
# an image of a type Ivy does not read).
REJECTED = frozenset({400, 413, 415, 422})


# One input of a request: a text, or (dense) an {"image": ...} item.
Input = Union[str, dict]


class ApiError(Exception):
    """Ivy refused for good (or retries ran out); ``status`` is the HTTP
    status (0: no answer) and the message Ivy's own, when it gave one."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}" if status else message)
        self.status = status
        self.message = message

    def __reduce__(self):  # pickled by Ray, from a task to the driver
        return type(self), (self.status, self.message)


class Rejected(ApiError):
    """Ivy rejected the request's content (400/413/415/422): a bad row."""


@dataclass(frozen=True)
class Retry:
    """Backoff: the n-th retry waits ``base * 2**n`` seconds, at most
    ``cap``, times a random factor in [0.5, 1] (so clients that failed
    together do not retry together), until the gateway has been failing
    for ``give_up_after`` seconds. That budget is one for the whole client
    (``Ivy``): its clock starts at the first failure of any request and
    stops at the next success, so set-up calls made one after another and
    requests in flight together share it instead of each waiting it out."""

    base: float = 0.25
    cap: float = 10.0
    give_up_after: float = 600.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        d = min(self.cap, self.base * 2 ** attempt) * random.uniform(0.5, 1.0)
        return max(d, min(retry_after or 0.0, self.cap))


@dataclass
class Embedded:
    """One request's answer: per input, a dense vector, a sparse (indices,
    values) pair, or a (tokens × dim) matrix; and the tokens Ivy counted."""

    rows: list
    tokens: int


# The route and the JSON body field of each output kind.
ROUTES = {"dense": ("/v1/embeddings", "input"), "sparse": ("/embed_sparse", "inputs"),
          "multi_vector": ("/embed_all", "inputs")}


class Ivy:
    """A client of one Ivy gateway. Thread-safe: each thread gets its own
    keep-alive connection."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 120.0,
                 retry: Retry = Retry(), on_retry=None):
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port or (443 if self._https else 80)
        # The base URL an OpenAI client is given ends in /v1; Ivy's routes
        # (/info, /embed_sparse, /v1/embeddings) hang off the root.
        self._prefix = parts.path.rstrip("/").removesuffix("/v1")
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = timeout
        self.retry = retry
        self._on_retry = on_retry or (lambda status, message, delay: None)
        self._local = threading.local()
        # When the gateway started failing (None: the last answer was a
        # success): the one clock of the retry budget.
        self._failing_since: float | None = None
        self._lock = threading.Lock()

    # One request, no retries.

    def _connection(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = self._local.conn = cls(self._host, self._port, timeout=self.timeout)
        return conn

    def _drop_connection(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    def _once(self, method: str, path: str, body: bytes | None) -> tuple[int, dict, bytes]:
        """(status, headers, body); raises OSError / HTTPException when no
        answer came."""
        conn = self._connection()
        try:
            conn.request(method, self._prefix + path, body=body, headers=self._headers)
            r = conn.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException):
            self._drop_connection()
            raise
        if r.will_close:
            self._drop_connection()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    # With retries.

    def request(self, method: str, path: str, payload=None) -> tuple[dict, bytes]:
        """(headers, body) of a 2xx answer, retrying what can be retried;
        raises ``Rejected`` for 400/413/415/422, ``ApiError`` otherwise."""
        body = None if payload is None else json.dumps(payload, ensure_ascii=False).encode()
        attempt = 0
        while True:
            try:
                status, headers, data = self._once(method, path, body)
                retry_after = _seconds(headers.get("retry-after"))
            except (OSError, http.client.HTTPException) as e:
                status, data, retry_after = 0, f"no answer from {self._host}:{self._port}: {e!r}".encode(), None
            if status and status not in RETRYABLE:
                with self._lock:  # the gateway answered: it is not failing
                    self._failing_since = None
            if 200 <= status < 300:
                return headers, data
            message = _message(data)
            if status in REJECTED:
                raise Rejected(status, message)
            if status and status not in RETRYABLE:
                raise ApiError(status, message)
            now = time.monotonic()
            with self._lock:
                if self._failing_since is None:
                    self._failing_since = now
                failing_for = now - self._failing_since
            if failing_for > self.retry.give_up_after:
                raise ApiError(status, f"{message} (still failing after {self.retry.give_up_after:.0f}s of retries)")
            delay = self.retry.delay(attempt, retry_after)
            self._on_retry(status, message, delay)
            time.sleep(delay)
            attempt += 1

    def get_json(self, path: str):
        return json.loads(self.request("GET", path)[1])

    def info(self, model: str | None = None) -> dict:
        """``/info`` of ``model`` (a served model or a LoRA adapter; None:
        the default model). An unknown one raises ``ApiError`` 404 with
        Ivy's message, which names the models it serves."""
        return self.get_json("/info" + (f"?model={quote(model, safe='')}" if model else ""))

    def embed(self, kind: str, texts: Sequence[Input], options: dict) -> Embedded:
        """Embeddings of ``texts`` (``kind`` one of ``ROUTES``): strings, or
        for dense ``{"image": ...}`` items; ``options`` are body fields
        (``truncate``, ``prompt_name``, ``dimensions``, ``priority``)."""
        path, field = ROUTES[kind]
        payload = {field: texts, **options}
        if kind == "dense":
            # Base64 float32: exact, and far cheaper to parse than JSON floats.
            payload["encoding_format"] = "base64"
        headers, data = self.request("POST", path, payload)
        body = json.loads(data)
        tokens = int(headers.get("x-compute-tokens", 0) or 0)
        rows: list  # per input: a vector, an (indices, values) pair or a matrix (Embedded.rows)
        if kind == "dense":
            items = sorted(body["data"], key=lambda d: d["index"])
            rows = [np.frombuffer(base64.b64decode(d["embedding"]), dtype="<f4") for d in items]
            tokens = tokens or int(body.get("usage", {}).get("prompt_tokens", 0))
        elif kind == "sparse":
            rows = [(np.array([v["index"] for v in r], dtype=np.int32),
                     np.array([v["value"] for v in r], dtype=np.float32)) for r in body]
        else:
            rows = [np.asarray(r, dtype=np.float32) for r in body]
        if len(rows) != len(texts):
            raise ApiError(200, f"asked for {len(texts)} embeddings, got {len(rows)}")
        return Embedded(rows, tokens)

    def embed_rows(self, kind: str, texts: Sequence[Input], options: dict) -> tuple[list, dict[int, str], int]:
        """Embeddings of ``texts`` where Ivy takes them: (outputs, None for
        each text Ivy rejected; text index → why; tokens). When Ivy
        rejects the request, some text in it is bad: the texts are sent one
        at a time to find which."""
        try:
            res = self.embed(kind, texts, options)
            return res.rows, {}, res.tokens
        except Rejected:
            pass
        outputs: list = []
        errors: dict[int, str] = {}
        tokens = 0
        for i, text in enumerate(texts):
            try:
                res = self.embed(kind, [text], options)
            except Rejected as e:
                outputs.append(None)
                errors[i] = f"rejected by Ivy (HTTP {e.status}): {e.message}"
                continue
            outputs.append(res.rows[0])
            tokens += res.tokens
        return outputs, errors, tokens


# Ivy's priority classes (docs/api.md, "Priority classes").
PRIORITIES = ("batch", "interactive")


def request_options(truncate: bool = True, prompt_name: str | None = None, dimensions: int | None = None,
                    priority: str = "batch", model: str | None = None) -> dict:
    """The body fields of a bulk request: bulk work goes in Ivy's ``batch``
    priority class, so interactive queries are served first; ``model``
    picks a served model or a LoRA adapter (None: the gateway's default)."""
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {', '.join(PRIORITIES)}, got {priority!r}")
    body = {"truncate": truncate, "priority": priority}
    if model:
        body["model"] = model
    if prompt_name:
        body["prompt_name"] = prompt_name
    if dimensions:
        body["dimensions"] = dimensions
    return body


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None


def _message(data: bytes) -> str:
    """Ivy's error message from either error shape (OpenAI's or TEI's)."""
    try:
        body = json.loads(data)
    except ValueError:
        return data.decode(errors="replace")[:500]
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict):
            return str(err.get("message", err))
        if err is not None:
            return str(err)
    return str(body)[:500]

