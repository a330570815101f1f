"""The latency settings, with real processes: Ivy reaching Tulip over its
Unix socket, Ivy on one I/O thread with busy polling, and Tulip's inline
steps (a lone request runs on its own thread; concurrent ones still share
steps). Embeddings are compared with sentence-transformers."""

from __future__ import annotations

import tempfile
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bench.harness.fixtures import corpus_lines
from tests.support.http import embed
from tests.support.servers import Ivy, Tulip


@pytest.fixture(scope="module")
def colocated(minilm_dir, log_dir):
    sock = tempfile.mktemp(prefix="tulip-test-", suffix=".sock")
    tulip = Tulip(minilm_dir, log_dir=log_dir, unix_socket=sock)
    ivy = Ivy([f"unix://{sock}"], minilm_dir, log_dir=log_dir, io_threads=1, busy_poll_us=300)
    yield tulip, ivy
    ivy.stop()
    tulip.stop()


def test_unix_socket_path_matches_sentence_transformers(colocated, st_minilm):
    _, ivy = colocated
    texts = corpus_lines("botchan.txt")[300:340]
    got = np.concatenate([embed(ivy, [t]) for t in texts[:8]] + [embed(ivy, texts[8:])])
    want = st_minilm.encode(texts, normalize_embeddings=True)
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cos.min() >= 0.999


def test_lone_requests_run_inline_and_concurrent_ones_share_steps(colocated):
    tulip, ivy = colocated
    texts = corpus_lines("botchan.txt")[400:464]
    inline = tulip.metric("tulip_inline_steps_total")
    for t in texts[:5]:
        embed(ivy, [t])
    assert tulip.metric("tulip_inline_steps_total") >= inline + 5
    steps = tulip.metric("tulip_batch_sequences_count")
    seqs = tulip.metric("tulip_batch_sequences_sum")
    with ThreadPoolExecutor(32) as pool:
        out = list(pool.map(lambda t: embed(ivy, [t]), texts))
    assert all(o.shape == (1, 384) for o in out)
    shared = (tulip.metric("tulip_batch_sequences_sum") - seqs) / (
        tulip.metric("tulip_batch_sequences_count") - steps)
    assert shared > 1, f"{shared} sequences per step under 32 concurrent requests"
