"""Tulip frames (proto/src/frames.rs), with real processes: Ivy's Embed calls
to a Tulip on a Unix socket go as frames on the same socket that still
serves gRPC; the embeddings are the ones gRPC gives (and sentence-
transformers'); bad frames get clear refusals without costing the server;
a restarted Tulip is reconnected to. The codec below is written from the
format's description, so it also checks the description."""

from __future__ import annotations

import socket
import struct
import tempfile
import time

import numpy as np
import pytest

from bench.harness.fixtures import corpus_lines
from tests.support.http import embed
from tests.support.servers import Ivy, Tulip
from tests.support.vectors import cosines

PREFACE = b"TLPF" + struct.pack("<I", 1)
EMBED, CANCEL = 1, 2
INVALID_ARGUMENT, OUT_OF_RANGE = 3, 11


@pytest.fixture(scope="module")
def colocated(minilm_dir, log_dir):
    sock = tempfile.mktemp(prefix="tulip-frames-", suffix=".sock")
    tulip = Tulip(minilm_dir, log_dir=log_dir, unix_socket=sock)
    frames = Ivy([f"unix://{sock}"], minilm_dir, log_dir=log_dir)
    grpc = Ivy([f"unix://{sock}"], minilm_dir, log_dir=log_dir, unix_frames="false")
    yield tulip, frames, grpc, sock
    grpc.stop()
    frames.stop()
    tulip.stop()


def test_frames_and_grpc_on_one_socket_give_the_same_embeddings(colocated, st_minilm):
    tulip, frames, grpc, _ = colocated
    texts = corpus_lines("botchan.txt")[500:540]
    by_frames = np.concatenate([embed(frames, [t]) for t in texts[:6]] + [embed(frames, texts[6:])])
    by_grpc = embed(grpc, texts)
    assert cosines(by_frames, by_grpc).min() >= 0.9999
    assert cosines(by_frames, st_minilm.encode(texts, normalize_embeddings=True)).min() >= 0.999
    # Exactly one Ivy talks frames; the other one's calls were gRPC.
    assert tulip.metric("tulip_frames_connections") == 1


def test_info_over_grpc_on_the_unix_socket_offers_frames(colocated):
    from tulip.client import TulipClient

    _, _, _, sock = colocated
    with TulipClient(f"unix://{sock}") as client:
        assert client.info().unix_frames


class Conn:
    """A raw frames connection, speaking the format as documented."""

    def __init__(self, path: str):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(30)
        self.s.connect(path)
        self.s.sendall(PREFACE)

    def call(self, tag: int, payload: bytes, kind: int = EMBED, traceparent: bytes = b"") -> None:
        body = struct.pack("<BQH", kind, tag, len(traceparent)) + traceparent + payload
        self.s.sendall(struct.pack("<I", len(body)) + body)

    def reply(self) -> tuple[int, int, int, bytes]:
        (length,) = struct.unpack("<I", self._exactly(4))
        body = self._exactly(length)
        tag, code, flags = struct.unpack("<QBB", body[:10])
        return tag, code, flags, body[10:]

    def closed(self) -> bool:
        try:
            return self.s.recv(1) == b""
        except ConnectionResetError:
            return True

    def _exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.s.recv(n - len(out))
            assert chunk, "connection closed"
            out += chunk
        return out

    def close(self) -> None:
        self.s.close()


def request(ids: list[int], request_id: str = "") -> bytes:
    from tulip.client import load_stubs

    pb2, _ = load_stubs("tulip")
    return pb2.EmbedRequest(token_ids=ids, lengths=[len(ids)], request_id=request_id).SerializeToString()


def test_raw_frames_answer_and_refuse_each_call_on_its_own(colocated):
    from tulip.client import load_stubs

    pb2, _ = load_stubs("tulip")
    tulip, _, _, sock = colocated
    c = Conn(sock)
    try:
        # Two calls in flight, then a call whose message does not decode,
        # then one with an id outside the vocabulary: each gets its answer.
        c.call(11, request([101, 7592, 2088, 102], "raw-1"))
        c.call(12, request([101, 2088, 102]), traceparent=b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        c.call(13, b"\xff\xff\xff")
        c.call(14, request([101, 10 ** 7, 102]))
        replies = {tag: (code, flags, payload) for tag, code, flags, payload in (c.reply() for _ in range(4))}
        assert set(replies) == {11, 12, 13, 14}
        for tag in (11, 12):
            code, _, payload = replies[tag]
            assert code == 0
            resp = pb2.EmbedResponse.FromString(payload)
            assert (resp.rows, resp.dim) == (1, 384) and len(resp.data) == 384 * 4
        assert replies[13][0] == INVALID_ARGUMENT and b"decode" in replies[13][2]
        assert replies[14][0] == INVALID_ARGUMENT and b"vocab" in replies[14][2].lower()
        # An oversized call is read past and refused; the connection goes on.
        limit = 256 * 1024 * 1024
        c.s.sendall(struct.pack("<IBQ", limit + 1, EMBED, 15))
        zeros = bytes(1 << 20)
        left = limit + 1 - 9
        while left:
            n = min(left, len(zeros))
            c.s.sendall(zeros[:n])
            left -= n
        tag, code, _, payload = c.reply()
        assert (tag, code) == (15, OUT_OF_RANGE) and b"limit" in payload
        c.call(16, request([101, 102]))
        assert c.reply()[:2] == (16, 0)
        # A cancel for a call already answered (or never made) is a no-op.
        c.call(16, b"", kind=CANCEL)
        c.call(17, request([101, 102]))
        assert c.reply()[:2] == (17, 0)
        # A frame of an unknown type breaks the protocol: closed.
        c.call(18, b"", kind=77)
        assert c.closed()
    finally:
        c.close()
    # Another version than 1: closed without an answer.
    bad = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bad.settimeout(30)
    bad.connect(sock)
    bad.sendall(b"TLPF" + struct.pack("<I", 99))
    assert bad.recv(1) == b""
    bad.close()
    # A caller that leaves with calls in flight costs nothing.
    c = Conn(sock)
    for tag in range(20):
        c.call(tag, request([101, 2023, 2003, 102]))
    # It leaves: Tulip reads the end of the stream, drops the calls still
    # running and closes its side once no call can answer any more (EOF
    # here). Only then can "nothing left active" be checked; a read made
    # earlier may come before the calls have even started.
    c.s.shutdown(socket.SHUT_WR)
    while c.s.recv(65536):
        pass
    c.close()
    deadline = time.monotonic() + 10
    while tulip.metric("tulip_active_requests") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert tulip.metric("tulip_active_requests") == 0


def test_a_restarted_tulip_is_reconnected_to(minilm_dir, log_dir):
    sock = tempfile.mktemp(prefix="tulip-frames-", suffix=".sock")
    tulip = Tulip(minilm_dir, log_dir=log_dir, unix_socket=sock)
    ivy = Ivy([f"unix://{sock}"], minilm_dir, log_dir=log_dir)
    try:
        before = embed(ivy, ["a query before the restart"])
        assert tulip.metric("tulip_frames_connections") == 1
        tulip.stop()
        tulip = Tulip(minilm_dir, log_dir=log_dir, unix_socket=sock)
        deadline = time.monotonic() + 30
        while True:
            status, body = ivy.post_json("/v1/embeddings", {"input": ["a query before the restart"]})
            if status == 200 or time.monotonic() > deadline:
                break
            assert status == 503, body
            time.sleep(0.1)
        assert status == 200, body
        after = np.array([body["data"][0]["embedding"]], dtype=np.float32)
        assert cosines(before, after).min() >= 0.9999
        assert tulip.metric("tulip_frames_connections") == 1
    finally:
        ivy.stop()
        tulip.stop()
