"""The benchmark harness: its statistics, its HTTP client against a real
server, its gate, exact-length inputs, and the GPU script's dry run (so the
script keeps working between GPU runs). No timing is asserted."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys

import numpy as np
import pytest

from bench.harness import affinity, gate, inputs
from bench.harness.httpclient import HttpClient
from bench.harness.timing import Stats, interleave, percentile
from tests.support.servers import REPO


def test_percentile_matches_numpy():
    rng = random.Random(3)
    for n in (1, 2, 7, 100, 1001):
        xs = sorted(rng.random() for _ in range(n))
        for q in (0, 50, 90, 99, 100):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12)


def test_stats_in_milliseconds():
    s = Stats.of([0.001, 0.002, 0.003])
    assert (s.count, s.p50, s.min, s.max) == (3, pytest.approx(2.0), pytest.approx(1.0), pytest.approx(3.0))


def test_interleave_calls_every_side_every_round():
    calls: list[tuple[str, int]] = []
    out = interleave({"a": lambda i: calls.append(("a", i)), "b": lambda i: calls.append(("b", i))},
                     rounds=5, warmup=2)
    assert [len(v) for v in out.values()] == [5, 5]
    assert sorted(calls) == sorted([(s, i) for s in "ab" for i in (0, 1)] + [(s, i) for s in "ab" for i in range(5)])


def test_one_core_pins_every_thread_of_a_process_tree_and_restores_them():
    # A process with a second thread and a child: all of them, and this
    # process, run on one CPU inside the block and get their CPUs back after.
    code = ("import subprocess, sys, threading, time; threading.Thread(target=time.sleep, args=(60,), daemon=True)"
            ".start(); subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
            "print('ready', flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        tids = affinity.threads(proc.pid)
        assert len(tids) >= 3  # main thread, the sleeper thread, the child
        before = {t: os.sched_getaffinity(t) for t in tids}
        mine = os.sched_getaffinity(0)
        with affinity.one_core([proc.pid]) as cpu:
            assert cpu == min(mine)
            assert all(os.sched_getaffinity(t) == {cpu} for t in tids)
            assert os.sched_getaffinity(0) == {cpu}
        assert {t: os.sched_getaffinity(t) for t in tids} == before
        assert os.sched_getaffinity(0) == mine
    finally:
        for child in open(f"/proc/{proc.pid}/task/{proc.pid}/children").read().split():
            os.kill(int(child), 9)
        proc.kill()
        proc.wait()


def test_gate_refuses_different_vectors():
    a = np.eye(3, dtype=np.float32)
    assert gate.check("same", a, a * 2, "ref")["passed"]
    with pytest.raises(gate.GateFailed):
        gate.check("rotated", a, a[[1, 2, 0]], "ref")
    with pytest.raises(gate.GateFailed):
        gate.check("shape", a[:2], a, "ref")


def test_text_of_exact_token_count(minilm_dir):
    for n in (5, 128, 256):
        assert inputs.count(minilm_dir, inputs.text_of_tokens(minilm_dir, n)) == n


def test_raw_http_client_against_ivy(ivy_minilm):
    with HttpClient("127.0.0.1", ivy_minilm.port) as c:
        req = c.prepare("/v1/embeddings", {"input": ["one line", "another line"]})
        for _ in range(3):  # the same kept-alive connection
            status, body = c.send(req)
            assert status == 200
            assert len(json.loads(body)["data"]) == 2
        status, body = c.post_json("/v1/embeddings", {"input": []})
        assert status == 422 and "error" in body


@pytest.mark.slow
def test_gpu_script_dry_run(tmp_path):
    """Every section of the GPU script on the CPU with tiny shapes (the
    harness's failure handling is tested in test_gpu_dry_run.py)."""
    res = subprocess.run([sys.executable, "-m", "bench.gpu.run", "--dry-run", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    out = json.loads((tmp_path / "gpu.json").read_text())
    assert out["dry_run"] and out["passed"] and (tmp_path / "gpu.md").is_file()
    sections = out["sections"]
    assert sections["gate/minilm"]["status"] == "ok"
    assert sections["check/graph_replay/minilm"]["status"] == "ok"
    assert sections["check/event_wait"]["status"] == "ok"
    for name in ("graphs", "online", "scoring", "throughput", "concurrency", "overlap"):
        assert sections[f"minilm/{name}"]["status"] == "ok", (name, sections[f"minilm/{name}"])
    assert sections["backends"]["status"] == "ok" and sections["backends"]["result"]["cells"]
    assert sections["gpu_tests"]["status"] == "ok"  # collected, and skipped without CUDA