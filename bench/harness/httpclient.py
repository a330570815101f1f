"""A minimal keep-alive HTTP/1.1 client over one socket.

Benchmarks time whole requests from the client's side; a heavyweight client
(urllib, requests) would add the same hundreds of microseconds to every
server and hide the differences being measured. This one sends a prepared
request and reads exactly one response, with nothing else on the path.
"""

from __future__ import annotations

import json
import socket


class HttpError(RuntimeError):
    pass


class HttpClient:
    """One persistent connection to ``host:port``; not thread-safe."""

    def __init__(self, host: str, port: int, timeout: float = 300.0):
        self.host, self.port, self.timeout = host, port, timeout
        self._sock: socket.socket | None = None
        self._buf = b""
        self._used = False
        self.reconnects = 0  # stale keep-alive connections replaced

    @classmethod
    def for_url(cls, url: str, timeout: float = 300.0) -> "HttpClient":
        hostport = url.removeprefix("http://").split("/", 1)[0]
        host, port = hostport.rsplit(":", 1)
        return cls(host, int(port), timeout)

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock, self._buf, self._used = None, b"", False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def prepare(self, path: str, payload) -> bytes:
        """The bytes of a JSON POST, built once and sent many times."""
        body = json.dumps(payload).encode()
        head = (f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n")
        return head.encode() + body

    def send(self, request: bytes) -> tuple[int, bytes]:
        """Sends prepared request bytes; returns (status, body). A kept-alive
        connection that the server closed while idle is replaced once, as
        every HTTP client does."""
        reused = self._sock is not None and self._used
        try:
            return self._exchange(request)
        except (OSError, HttpError):
            self.close()
            if not reused:
                raise
        self.reconnects += 1
        try:
            return self._exchange(request)
        except (OSError, HttpError):
            self.close()
            raise

    def send_ok(self, request: bytes) -> bytes:
        """``send``, raising unless the answer is 200: a timed side that
        failed must not pass for a fast one."""
        status, body = self.send(request)
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:200]!r}")
        return body

    def _exchange(self, request: bytes) -> tuple[int, bytes]:
        if self._sock is None:
            self._sock = socket.create_connection((self.host, self.port), timeout=self.timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.sendall(request)
        out = self._read_response()
        self._used = True
        return out

    def post_json(self, path: str, payload) -> tuple[int, object]:
        status, body = self.send(self.prepare(path, payload))
        return status, json.loads(body)

    def _fill(self) -> None:
        chunk = self._sock.recv(1 << 20)
        if not chunk:
            raise HttpError("connection closed by the server")
        self._buf += chunk

    def _read_until(self, marker: bytes) -> bytes:
        while (i := self._buf.find(marker)) < 0:
            self._fill()
        out, self._buf = self._buf[:i], self._buf[i + len(marker):]
        return out

    def _read_exact(self, n: int) -> bytes:
        while len(self._buf) < n:
            self._fill()
        out, self._buf = self._buf[:n], self._buf[n:]
        return out

    def _read_response(self) -> tuple[int, bytes]:
        head = self._read_until(b"\r\n\r\n").decode("latin-1").split("\r\n")
        try:
            status = int(head[0].split(" ", 2)[1])
        except (IndexError, ValueError):
            raise HttpError(f"bad status line {head[0]!r}") from None
        headers = {}
        for line in head[1:]:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
        if "content-length" in headers:
            body = self._read_exact(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while (size := int(self._read_until(b"\r\n").split(b";")[0], 16)) > 0:
                parts.append(self._read_exact(size))
                self._read_exact(2)
            self._read_until(b"\r\n")
            body = b"".join(parts)
        else:
            raise HttpError("response has neither Content-Length nor chunked encoding")
        if headers.get("connection", "").lower() == "close":
            self.close()
        return status, body
