"""Models by name: ``python -m tulip --model org/name[@rev]`` resolves the id
through huggingface_hub, from a cache laid out as huggingface_hub lays it
out (offline) or from a local HTTP server speaking the Hub's file API
(``HF_ENDPOINT``). No internet is used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bench.harness.tiny_models import st_pipeline, tiny_bert
from rose import Engine
from tests.support.fake_hub import FakeHub, files_of, hub_cache
from tests.support.servers import REPO, Tulip

MINILM_ID = "sentence-transformers/all-MiniLM-L6-v2"
COMMIT = "c9745ed1d9f207416be6d2e6f8de32d1f16199bf"
OTHER_COMMIT = "0123456789abcdef0123456789abcdef01234567"


TEXTS = ["What is an embedding?", "A vector that captures meaning.", "Zürich liegt am See.", "a"]


def tokenize(model_dir: Path, texts: list[str]) -> list[list[int]]:
    from tokenizers import Tokenizer

    return [e.ids for e in Tokenizer.from_file(str(model_dir / "tokenizer.json")).encode_batch(texts)]


def _env(**kw) -> dict[str, str]:
    """The environment of a child process: the Hub settings given, and none
    inherited (an HF_TOKEN or HF_ENDPOINT of the caller must not leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(kw)
    return env


def _resolve(model: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``rose.hub.resolve`` in a fresh process (huggingface_hub reads its
    settings at import), printing the directory."""
    code = "import sys; from rose.hub import resolve; print(resolve(sys.argv[1])[0])"
    return subprocess.run([sys.executable, "-c", code, model], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.fixture(scope="module")
def hub():
    server = FakeHub()
    yield server
    server.close()


@pytest.fixture(scope="module")
def st_dense_dir(tmp_path_factory):
    """A sentence-transformers model with a Dense module, saved by
    sentence-transformers (safetensors everywhere)."""
    root = tmp_path_factory.mktemp("hub-models")
    return st_pipeline(root / "st-dense", tiny_bert(root / "bert"), dense=((48, "Tanh"),))


def test_offline_cache_serves_by_id(tmp_path, minilm_dir, st_minilm, log_dir):
    """The embedded all-MiniLM-L6-v2 laid out in HF_HOME's hub cache; with
    HF_HUB_OFFLINE=1 a real Tulip serves it by its Hub id."""
    home = tmp_path / "hf-home"
    snapshot = hub_cache(home / "hub", MINILM_ID, files_of(Path(minilm_dir)), COMMIT)
    assert (snapshot / "model.safetensors").is_symlink()
    feats = st_minilm.tokenize(TEXTS)
    seqs = [ids[m.bool()].tolist() for ids, m in zip(feats["input_ids"], feats["attention_mask"])]
    want = st_minilm.encode(TEXTS, convert_to_tensor=True).float()
    proc = Tulip(MINILM_ID, log_dir=log_dir, env=_env(HF_HOME=str(home), HF_HUB_OFFLINE="1"), threads=1)
    try:
        with proc.client() as client:
            info = client.info()
            assert (info.model_id, info.dimension) == (MINILM_ID, 384)
            got = torch.from_numpy(client.embed(seqs).values.copy())
        assert torch.nn.functional.cosine_similarity(got, want).min() >= 0.999
    finally:
        proc.stop()


def test_offline_missing_id_is_a_clear_error(tmp_path, log_dir):
    cache = tmp_path / "empty-cache"
    cache.mkdir()
    r = subprocess.run([sys.executable, "-m", "tulip", "--model", "acme/not-cached@v2", "--port", "0",
                        "--metrics-port", "0"],
                       env=_env(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1"), capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, r.stderr
    assert "acme/not-cached@v2 is not in the cache" in r.stderr, r.stderr
    assert str(cache / "models--acme--not-cached") in r.stderr and "HF_HUB_OFFLINE is set" in r.stderr


def test_missing_directory_is_a_clear_error():
    r = _resolve("./no/such/model/dir", _env(HF_HUB_OFFLINE="1"))
    assert r.returncode != 0 and "model directory ./no/such/model/dir does not exist" in r.stderr, r.stderr


def test_download_from_the_hub_api(tmp_path, hub, st_dense_dir, log_dir):
    """A download through the real client against the fake Hub at a named
    revision: only serving files come (no .bin next to safetensors, no
    ONNX), the cache is huggingface_hub's, and a real Tulip serves what the
    in-process engine computes on the original directory."""
    files = files_of(st_dense_dir)
    files["pytorch_model.bin"] = b"stale duplicate weights"
    files["onnx/model.onnx"] = b"not served"
    hub.add("acme/st-dense", files, COMMIT, branches={"main": OTHER_COMMIT, "v1": COMMIT})
    cache = tmp_path / "cache"
    proc = Tulip("acme/st-dense@v1", log_dir=log_dir, threads=1,
                 env=_env(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="0"))
    try:
        seqs = tokenize(st_dense_dir, TEXTS)
        with proc.client() as client:
            assert client.info().model_id == "acme/st-dense"
            got = client.embed(seqs).values
        want = Engine.from_dir(st_dense_dir, device="cpu", dtype="float32").embed(seqs).numpy()
        np.testing.assert_allclose(got, want, atol=1e-5)
    finally:
        proc.stop()
    fetched = set(hub.fetched())
    assert {"config.json", "model.safetensors", "modules.json", "2_Dense/model.safetensors",
            "2_Dense/config.json", "tokenizer.json"} <= fetched
    assert not fetched & {"pytorch_model.bin", "onnx/model.onnx"}
    repo = cache / "models--acme--st-dense"
    assert (repo / "refs" / "v1").read_text() == COMMIT
    assert (repo / "snapshots" / COMMIT / "2_Dense" / "model.safetensors").is_file()
    # Now cached: the same id resolves offline, without the server.
    r = _resolve("acme/st-dense@v1", _env(HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1"))
    assert r.returncode == 0 and r.stdout.strip() == str(repo / "snapshots" / COMMIT), r.stderr


def test_bin_weights_only_when_there_are_no_safetensors(tmp_path, hub):
    """A model with only pytorch_model.bin (and a Dense module saved the
    same way) is fetched with its .bin files and loads."""
    from safetensors.torch import load_file

    st = st_pipeline(tmp_path / "st", tiny_bert(tmp_path / "bert", seed=3), safe=False)
    files = {k: v for k, v in files_of(st).items() if not k.endswith(".safetensors")}
    torch.save(load_file(str(st / "model.safetensors")), tmp_path / "pytorch_model.bin")
    files["pytorch_model.bin"] = (tmp_path / "pytorch_model.bin").read_bytes()
    assert not any(k.endswith(".safetensors") for k in files)
    hub.add("acme/bin-only", files, OTHER_COMMIT)
    env = _env(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="0")
    r = _resolve("acme/bin-only", env)
    assert r.returncode == 0, r.stderr
    snapshot = Path(r.stdout.strip())
    assert (snapshot / "pytorch_model.bin").is_file() and (snapshot / "2_Dense" / "pytorch_model.bin").is_file()
    seqs = tokenize(st, TEXTS)
    got = Engine.from_dir(snapshot, device="cpu", dtype="float32").embed(seqs)
    want = Engine.from_dir(st, device="cpu", dtype="float32").embed(seqs)
    torch.testing.assert_close(got, want)


def test_private_model_needs_hf_token(tmp_path, hub, st_dense_dir):
    hub.add("acme/private", files_of(st_dense_dir), COMMIT, token="hf_secret")
    base = dict(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="0")
    r = _resolve("acme/private", _env(**base))
    assert r.returncode != 0 and "model acme/private was not found on " + hub.url in r.stderr, r.stderr
    assert "HF_TOKEN" in r.stderr
    r = _resolve("acme/private", _env(HF_TOKEN="hf_secret", **base))
    assert r.returncode == 0, r.stderr
    assert ("GET", "/api/models/acme/private/revision/main", "Bearer hf_secret") in hub.requests


@pytest.mark.parametrize("model,message", [
    ("acme/nothing-here", "model acme/nothing-here was not found on"),
    ("acme/st-dense@no-such-branch", "revision 'no-such-branch' of acme/st-dense was not found"),
])
def test_missing_id_or_revision_is_a_clear_error(tmp_path, hub, st_dense_dir, model, message):
    hub.add("acme/st-dense", files_of(st_dense_dir), COMMIT)
    r = _resolve(model, _env(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="0"))
    assert r.returncode != 0 and message in r.stderr, r.stderr
    assert "ModelLoadError" in r.stderr


def test_repository_without_config_is_a_clear_error(tmp_path, hub):
    hub.add("acme/not-a-model", {"README.md": b"# hello", "notes.json": b"{}"}, COMMIT)
    r = _resolve("acme/not-a-model", _env(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "c"), HF_HUB_OFFLINE="0"))
    assert r.returncode != 0 and "acme/not-a-model@main: the repository has no config.json" in r.stderr, r.stderr


def test_gated_model_is_a_clear_error_until_hf_token(tmp_path, hub, st_dense_dir):
    hub.add("acme/gated", files_of(st_dense_dir), COMMIT, token="hf_granted", gated=True)
    base = dict(HF_ENDPOINT=hub.url, HF_HUB_CACHE=str(tmp_path / "cache"), HF_HUB_OFFLINE="0")
    r = _resolve("acme/gated", _env(**base))
    assert r.returncode != 0 and "acme/gated@main is gated: accept its terms on the Hub and set HF_TOKEN" in r.stderr, \
        r.stderr
    assert _resolve("acme/gated", _env(HF_TOKEN="hf_granted", **base)).returncode == 0
