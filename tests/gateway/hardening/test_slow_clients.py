"""Slow and hostile clients against a real Ivy (in front of a real Tulip on
MiniLM): headers or bodies trickled a byte at a time, hundreds of idle
keep-alive connections, silent connections beyond the connection cap, a
client that never reads its large responses. Ivy closes each of them
(timeouts set small here) while a well-behaved client keeps being served.
Assertions are on behaviour (closed, refused, served); the waits are
generous deadlines, not latency thresholds."""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import threading
import time

import pytest

from tests.support.servers import Ivy, wait_for

TIMEOUTS = dict(header_timeout=1, body_timeout=1.5, idle_timeout=2, write_timeout=2)
# Long enough for any of the timeouts above to fire several times over.
PATIENCE = 30.0


@pytest.fixture(scope="module")
def ivy(tulip_minilm, minilm_dir, log_dir):
    proc = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, **TIMEOUTS)
    yield proc
    proc.stop()


# --- helpers -----------------------------------------------------------------

def connect(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setblocking(True)
    return s


def closed_by_peer(s: socket.socket, wait: float) -> bool:
    """Whether the server closes ``s`` within ``wait`` seconds (what it sent
    before is read and discarded)."""
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        ready, _, _ = select.select([s], [], [], 0.2)
        if ready:
            try:
                if not s.recv(65536):
                    return True
            except (ConnectionResetError, BrokenPipeError):
                return True
    return False


def read_response(s: socket.socket) -> tuple[int, bytes]:
    """One HTTP/1.1 response with a Content-Length: (status, body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {data!r}")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    length = next(int(v) for k, _, v in (l.partition(":") for l in lines[1:]) if k.lower() == "content-length")
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("closed mid-body")
        body += chunk
    return status, body


def ivy_connections(ivy: Ivy, port: int) -> int:
    """Client connections Ivy has accepted on ``port`` and not closed: its
    socket descriptors whose TCP entry has that local port and a state Ivy
    has not closed yet (established, or closed by the client only)."""
    inodes = set()
    fd_dir = f"/proc/{ivy.proc.pid}/fd"
    for fd in os.listdir(fd_dir):
        with contextlib.suppress(OSError):
            link = os.readlink(f"{fd_dir}/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    count = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            fields = line.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            state, inode = fields[3], fields[9]
            if local_port == port and state in ("01", "08") and inode in inodes:
                count += 1
    return count


class NormalClient:
    """A well-behaved client sending small embedding requests in a loop on
    fresh connections; every answer it gets is recorded."""

    def __init__(self, ivy: Ivy):
        self.ivy = ivy
        self.statuses: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            status, _ = self.ivy.post_json("/v1/embeddings", {"input": ["a normal request"]})
            self.statuses.append(status)
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=60)
        if exc[0] is None:
            assert self.statuses, "the normal client sent nothing"
            assert set(self.statuses) == {200}, sorted(set(self.statuses))


# --- tests -------------------------------------------------------------------

def test_headers_trickled_a_byte_at_a_time_are_cut(ivy):
    with NormalClient(ivy):
        socks = [connect(ivy.port) for _ in range(20)]
        request = b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: " + b"a" * 10_000
        closed = [False] * len(socks)
        deadline = time.monotonic() + PATIENCE
        i = 0
        while not all(closed) and time.monotonic() < deadline and i < len(request):
            for n, s in enumerate(socks):
                if closed[n]:
                    continue
                try:
                    s.send(request[i:i + 1])
                except OSError:
                    closed[n] = True
                    continue
                ready, _, _ = select.select([s], [], [], 0)
                if ready and not s.recv(65536):
                    closed[n] = True
            i += 1
            time.sleep(0.05)
        assert all(closed), f"{closed.count(False)} trickling connections still open"
        for s in socks:
            s.close()


@pytest.mark.parametrize("path", ["/v1/embeddings", "/embed"])
def test_a_body_trickled_a_byte_at_a_time_gets_408(ivy, path):
    body = json.dumps({"input" if path.startswith("/v1") else "inputs": "x" * 5000}).encode()
    with NormalClient(ivy):
        s = connect(ivy.port)
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n".encode())
        answer = b""
        deadline = time.monotonic() + PATIENCE
        for byte in body:
            if time.monotonic() > deadline:
                break
            try:
                s.send(bytes([byte]))
            except OSError:
                break
            ready, _, _ = select.select([s], [], [], 0.05)
            if ready:
                answer = s.recv(65536)
                break
        assert answer.startswith(b"HTTP/1.1 408"), answer[:200]
        payload = json.loads(answer.partition(b"\r\n\r\n")[2] or b"{}")
        if path.startswith("/v1"):
            assert payload["error"]["code"] == "client_timeout"
            assert payload["error"]["type"] == "invalid_request_error"
        else:
            assert payload["error_type"] == "Validation"
        assert "not received" in json.dumps(payload)
        assert closed_by_peer(s, PATIENCE)
        s.close()
    document = json.loads(ivy.get("/openapi.json")[1])
    assert "408" in document["paths"][path]["post"]["responses"]


def test_hundreds_of_idle_keepalive_connections_are_closed(ivy):
    with NormalClient(ivy):
        socks = []
        for _ in range(300):
            s = connect(ivy.port)
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
            socks.append(s)
        for s in socks:
            assert read_response(s)[0] == 200  # kept alive, then idle
        silent = [connect(ivy.port) for _ in range(100)]  # never send a byte
        wait_for(lambda: all(closed_by_peer(s, 0.01) for s in socks + silent),
                 "Ivy to close its idle connections", timeout=PATIENCE)
        wait_for(lambda: ivy_connections(ivy, ivy.port) <= 5, "Ivy to release the sockets", timeout=PATIENCE)
        for s in socks + silent:
            s.close()


def test_a_busy_keepalive_connection_is_not_cut_at_the_idle_timeout(ivy):
    s = connect(ivy.port)
    payload = json.dumps({"input": ["hello"]}).encode()
    request = (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(payload)) + payload
    # Requests spaced below the idle timeout, for longer than it in all.
    for _ in range(6):
        s.sendall(request)
        assert read_response(s)[0] == 200
        time.sleep(TIMEOUTS["idle_timeout"] / 2)
    s.close()


def test_a_client_that_never_reads_is_dropped_and_blocks_nobody(ivy):
    # Pipelined requests whose responses (about 2 MB each) are never read.
    inputs = ["never read " * 4] * 256
    payload = json.dumps({"input": inputs}).encode()
    request = (b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(payload)) + payload
    pipelined = 8
    readers = []
    with NormalClient(ivy):
        for _ in range(2):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", ivy.port))
            s.sendall(request * pipelined)
            readers.append(s)
        wait_for(lambda: ivy_connections(ivy, ivy.port) <= 2, "Ivy to drop the non-reading clients",
                 timeout=PATIENCE + 60)
        rss_kb = int(next(l.split()[1] for l in open(f"/proc/{ivy.proc.pid}/status") if l.startswith("VmRSS")))
    # What they can still read is what was sent before the drop: less than
    # all the responses they asked for.
    for s in readers:
        s.settimeout(10)
        received = 0
        with contextlib.suppress(OSError):
            while chunk := s.recv(1 << 20):
                received += len(chunk)
        assert received < pipelined * 2_000_000
        s.close()
    # Nothing of the unread responses stays behind in Ivy.
    assert rss_kb < 400_000, rss_kb


def test_connections_beyond_the_cap_wait_and_are_served(tulip_minilm, minilm_dir, log_dir):
    cap = 8
    ivy = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, max_connections=cap, **TIMEOUTS)
    try:
        silent = [connect(ivy.port) for _ in range(4 * cap)]
        seen = []
        result = {}

        def normal():
            result["status"] = ivy.post_json("/v1/embeddings", {"input": "behind the queue"})[0]

        t = threading.Thread(target=normal)
        t.start()
        while t.is_alive():
            seen.append(ivy_connections(ivy, ivy.port))
            time.sleep(0.05)
        t.join()
        assert result["status"] == 200
        assert max(seen) <= cap, max(seen)
        assert max(seen) == cap  # the cap was reached, not just approached
        assert "connection limit reached" in ivy.log()
        for s in silent:
            s.close()
    finally:
        ivy.stop()


def test_grpc_connections_that_never_speak_are_closed(ivy):
    socks = [connect(ivy.grpc_port) for _ in range(20)]
    trickler = connect(ivy.grpc_port)
    preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

    def trickle():
        for byte in preface:
            try:
                trickler.send(bytes([byte]))
            except OSError:
                return
            time.sleep(0.2)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    assert all(closed_by_peer(s, PATIENCE) for s in socks)
    assert closed_by_peer(trickler, PATIENCE)
    t.join()
    for s in socks + [trickler]:
        s.close()
