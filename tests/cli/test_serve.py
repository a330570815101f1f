"""``tulip-rose serve`` end to end: the command runs as a subprocess and
starts real Tulip replicas and a real Ivy. Its vectors must match
sentence-transformers on the same weights (the embedded MiniLM, a seeded
model directory with two replicas, and a Hub id from an offline cache);
the request it prints must work as printed; SIGTERM must let a request in
flight finish and leave none of its children behind; a child killed with
SIGKILL must make it exit 1 naming that child; bad usage must be refused
before anything starts."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest

from bench.harness import lora_adapters as lora
from bench.harness import tiny_models as models
from bench.harness.fixtures import corpus_lines
from tests.cli.serve_process import Serve, alive, children_of
from tests.support.fake_hub import files_of, hub_cache
from tests.support.servers import REPO, wait_for
from tests.support.vectors import cosines

pytestmark = pytest.mark.slow

TEXTS = corpus_lines("botchan.txt")[100:124] + corpus_lines("calibration_miracl.txt")[:8]


@pytest.fixture
def serves():
    started: list[Serve] = []
    yield started
    for s in started:
        if s.proc.poll() is None or any(alive(p) for p in s.child_pids().values()):
            s.kill_all()


def in_flight(s: Serve) -> float:
    """Ivy's ``ivy_requests_in_flight`` gauge."""
    with urllib.request.urlopen(s.url + "/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith("ivy_requests_in_flight "):
                return float(line.split()[1])
    raise AssertionError("no ivy_requests_in_flight in /metrics")


def printed_curl(stdout: str) -> list[str]:
    """The request of the banner, as an argument list (its line
    continuation joined)."""
    text = stdout.split("Try:\n", 1)[1].split("\n\n", 1)[0].replace("\\\n", " ")
    return shlex.split(text)


def test_default_model_matches_sentence_transformers_and_stops_cleanly(serves, st_minilm, log_dir):
    # A drain long enough for the large request below on a loaded 2-core
    # machine (at the default 30 s, load 5 cut it short).
    s = Serve("--drain-timeout", "600", log_dir=log_dir)
    serves.append(s)
    s.wait_ready()
    pids = s.child_pids()
    assert set(pids) == {"tulip-0", "ivy"}  # one replica on the CPU
    assert children_of(s.proc.pid) == set(pids.values())

    want = st_minilm.encode(TEXTS, convert_to_numpy=True, normalize_embeddings=True)
    assert cosines(s.embed(TEXTS), want).min() >= 0.999

    # The Batch API is on, its store in the user's data directory.
    with urllib.request.urlopen(s.url + "/v1/batches", timeout=10) as r:
        assert json.loads(r.read())["object"] == "list"
    assert (s.data_dir / "tulip-rose" / "batches" / "batches.sqlite3").is_file()

    # The request the banner shows works as printed.
    curl = printed_curl("".join(s.stdout))
    assert curl[0] == "curl"
    out = subprocess.run(curl, capture_output=True, text=True, timeout=60, check=True).stdout
    got = np.array([d["embedding"] for d in json.loads(out)["data"]], dtype=np.float32)
    want = st_minilm.encode(["What is an embedding?", "A vector that captures meaning."], normalize_embeddings=True)
    assert cosines(got, want).min() >= 0.999

    # SIGTERM while a large request is in flight: it is answered in full,
    # then every child is gone.
    baseline = in_flight(s)
    big = corpus_lines("calibration_miracl.txt")[:300] * 2
    answer: list = []
    # A generous client timeout: on a loaded 2-core machine this takes a while.
    sender = threading.Thread(target=lambda: answer.append(s.embed(big, timeout=600)))
    sender.start()
    wait_for(lambda: in_flight(s) > baseline, "the large request to be in flight", every=0.02)
    s.proc.send_signal(signal.SIGTERM)
    sender.join(600)
    assert answer and answer[0].shape == (len(big), 384)
    assert s.wait(timeout=660) == 0, s.log()[-4000:]
    left = [name for name, pid in pids.items() if alive(pid)]
    assert not left, f"still running after SIGTERM: {left}"
    assert "draining Ivy, then the replicas" in s.log()


def test_model_dir_two_replicas_and_a_killed_child(serves, tmp_path, log_dir):
    """A model directory on two replicas, flags passed through to each side,
    then one replica killed: serve names it and exits 1, leaving nothing."""
    from sentence_transformers import SentenceTransformer

    model_dir = models.tiny_bert(tmp_path / "tiny-bert", seed=3)
    s = Serve("--model", str(model_dir), "--replicas", "2", "--tulip-arg=--threads=1",
              "--ivy-arg", f"--max-inputs {len(TEXTS)}", log_dir=log_dir)
    serves.append(s)
    s.wait_ready()
    pids = s.child_pids()
    assert set(pids) == {"tulip-0", "tulip-1", "ivy"}

    want = SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)
    assert cosines(s.embed(TEXTS), want).min() >= 0.999

    # --ivy-arg reached Ivy: one input over its limit is refused.
    req = urllib.request.Request(s.url + "/v1/embeddings", data=json.dumps({"input": TEXTS + ["x"]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=60)
    assert refused.value.code in (413, 422) and str(len(TEXTS)) in refused.value.read().decode()

    os.kill(pids["tulip-1"], signal.SIGKILL)
    assert s.wait() == 1, s.log()[-4000:]
    log = s.log()
    assert f"tulip-1 (pid {pids['tulip-1']}) was killed by SIGKILL" in log
    assert "Its last log lines:" in log
    left = [name for name, pid in pids.items() if alive(pid)]
    assert not left, f"still running after serve exited: {left}"


def run_serve(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tulip_rose_cli", "serve", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={**os.environ, **(env or {})})


def test_several_models_behind_one_ivy(serves, tmp_path, log_dir):
    """Two --model: a replica per model behind one Ivy, which routes by
    `model`; the first is the default (TEI routes name none). LoRA
    adapters (TULIP_LORA, then --lora) are the first model's, each served as
    a model of its own; TULIP_LORA reaches its replica once, not again
    through the environment (a second load of a name is refused)."""
    embedder = models.tiny_bert(tmp_path / "embedder", seed=4)
    reranker = models.tiny_reranker(tmp_path / "reranker", seed=5, arch="bert")
    legal = lora.random_adapter(embedder, tmp_path / "legal", r=4, seed=6)
    medical = lora.random_adapter(embedder, tmp_path / "medical", r=4, seed=7)
    s = Serve("--model", str(embedder), "--model", str(reranker), "--lora", f"medical={medical}",
              "--max-adapters", "2", log_dir=log_dir, env={"TULIP_LORA": f"legal={legal}"})
    serves.append(s)
    s.wait_ready()
    assert set(s.child_pids()) == {"tulip-0", "tulip-1", "ivy"}

    def call(path: str, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(s.url + path, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            return json.loads(r.read())

    wait_for(lambda: len(call("/v1/models")["data"]) == 4, "both models and the adapters up", timeout=60)
    assert {m["id"]: m["parent"] for m in call("/v1/models")["data"]} == {
        "embedder": None, "legal": "embedder", "medical": "embedder", "reranker": None}
    base, adapted = (np.array(call("/v1/embeddings", {"input": ["a"], **model})["data"][0]["embedding"])
                     for model in ({}, {"model": "legal"}))
    assert np.abs(base - adapted).max() > 0.01
    ranked = call("/v1/rerank", {"model": "reranker", "query": "q", "documents": ["a", "b"]})
    assert ranked["model"] == "reranker" and len(ranked["results"]) == 2
    assert len(call("/embed", {"inputs": ["a"]})[0]) == 64  # the default model: the first --model
    s.proc.send_signal(signal.SIGTERM)
    assert s.wait() == 0, s.log()[-4000:]


def test_missing_ivy_binary_says_how_to_get_one(tmp_path):
    proc = run_serve(env={"IVY_BIN": str(tmp_path / "no-ivy")})
    assert proc.returncode == 2
    assert f"IVY_BIN {tmp_path / 'no-ivy'} is not an executable file" in proc.stderr


def test_lora_flags_reach_the_first_models_replicas(tmp_path, monkeypatch):
    """The command lines serve builds: TULIP_LORA's adapters, then --lora's,
    go to the first --model's replicas only; --max-adapters to every one; a
    path that is no directory is refused before anything starts."""
    from tulip_rose_cli import serve
    from tulip_rose_cli.cli import parser

    for name in ("legal", "medical"):
        (tmp_path / name).mkdir()
    monkeypatch.setenv("TULIP_LORA", f"legal={tmp_path / 'legal'}")
    args = parser().parse_args(["serve", "--model", "a", "--model", "b", "--lora", f"medical={tmp_path / 'medical'}",
                                "--max-adapters", "2"])
    args.lora = serve.adapters(args)
    stack = serve.Stack(args, serve.Log(False))
    stack.socket_dir.rmdir()  # made by Stack, not used here
    first = stack.tulip_cmd(0, "cpu", "/models/a", None, 2)
    other = stack.tulip_cmd(1, "cpu", "/models/b", None, 2, first=False)
    assert first[first.index("--lora") + 1] == f"legal={tmp_path / 'legal'},medical={tmp_path / 'medical'}"
    assert "--lora" not in other
    assert first[first.index("--max-adapters") + 1] == other[other.index("--max-adapters") + 1] == "2"
    monkeypatch.delenv("TULIP_LORA")
    bare = serve.Stack(parser().parse_args(["serve"]), serve.Log(False))
    bare.socket_dir.rmdir()
    assert "--lora" not in bare.tulip_cmd(0, "cpu", None, None, 1)
    with pytest.raises(serve.Usage, match="no such directory"):
        serve.adapters(parser().parse_args(["serve", "--lora", f"x={tmp_path / 'nowhere'}"]))
    proc = run_serve("--lora", "x")
    assert proc.returncode == 2 and "'x' is not NAME=PATH" in proc.stderr, proc.stderr


def test_hub_id_and_json_output(serves, tmp_path, log_dir):
    """A Hub id (from an offline Hugging Face cache laid out as
    huggingface_hub writes it) is served under that id; --json-output makes
    every line, the command's and its children's, a JSON object naming its
    process; Ctrl-C (SIGINT) stops it with exit 0."""
    from sentence_transformers import SentenceTransformer

    model_dir = models.tiny_bert(tmp_path / "tiny-bert", seed=5)
    hub_cache(tmp_path / "hub", "acme/tiny-bert", files_of(model_dir), "0123456789abcdef0123456789abcdef01234567")
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1")
    s = Serve("--model", "acme/tiny-bert", "--json-output", "--max-batch-tokens", "2048", log_dir=log_dir, env=env)
    serves.append(s)
    wait_for(lambda: s.proc.poll() is not None or '"message": "ready"' in s.log(), "the ready line", timeout=180)
    assert s.proc.poll() is None, s.log()[-4000:]

    req = urllib.request.Request(s.url + "/v1/embeddings", data=json.dumps({"input": TEXTS}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        body = json.loads(r.read())
    assert body["model"] == "acme/tiny-bert"
    want = SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS, normalize_embeddings=True)
    assert cosines([d["embedding"] for d in body["data"]], want).min() >= 0.999

    s.proc.send_signal(signal.SIGINT)
    assert s.wait() == 0, s.log()[-4000:]
    records = [json.loads(line) for line in s.log().splitlines() if line.strip()]
    assert {r["process"] for r in records} == {"serve", "tulip-0", "ivy"}
    assert not any(alive(p) for p in s.child_pids().values())
