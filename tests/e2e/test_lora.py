"""LoRA adapters per request, end to end: Ivy over real Tulips on the
embedded MiniLM, adapters in PEFT's format (random, seeded) loaded at start
(`tulip --lora`) and at run time (`POST /v1/load_lora_adapter`), each served
as a model name of its own; vectors against sentence-transformers on PEFT's
merged weights (cosine >= 0.999), requests of several adapters and the base
model mixed in the same steps, a replica that joins later catching up, bad
adapters refused without disturbing anything."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from bench.harness import lora_adapters as lora
from tests.support.http import embeddings_reply, get_json
from tests.support.servers import Ivy, Tulip
from tulip_rose_cli.processes import wait_for

pytestmark = pytest.mark.slow

TEXTS = ["What is an embedding?", "Berlin is the capital of Germany.",
         "A vector that captures the meaning of a text, for search.", "short"]


def cosines(a, b) -> np.ndarray:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, minilm_dir):
    root = tmp_path_factory.mktemp("lora")
    return {
        "legal": lora.random_adapter(minilm_dir, root / "legal", r=8, seed=1),
        "medical": lora.random_adapter(minilm_dir, root / "medical", targets=["query", "key", "value", "dense"],
                                       r=16, seed=2),
    }


@pytest.fixture(scope="module")
def wants(adapters, minilm_dir):
    out = {name: lora.merged_st(minilm_dir, path).encode(TEXTS) for name, path in adapters.items()}
    out["base"] = lora.merged_st(minilm_dir).encode(TEXTS)
    return out


@pytest.fixture(scope="module")
def stack(adapters, minilm_dir, log_dir):
    first = Tulip(minilm_dir, log_dir=log_dir, threads=1, lora=f"legal={adapters['legal']}")
    # A second replica whose process starts later (`late` below): Ivy knows
    # its address from the start.
    from tulip_rose_cli.launch import free_port

    late_port = free_port()
    ivy = Ivy([first.url, f"http://127.0.0.1:{late_port}"], minilm_dir, log_dir=log_dir, max_inputs=64)
    wait_for(lambda: ivy.post_json("/v1/embeddings", {"input": "x", "model": "legal"})[0] == 200,
             "the adapter served", timeout=60)
    yield ivy, first, late_port
    ivy.stop()
    first.stop()


def embed(ivy, model, texts=TEXTS):
    body = embeddings_reply(ivy, texts, **({"model": model} if model else {}))
    assert model is None or body["model"] == model
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32)


def test_an_adapter_loaded_at_start_is_a_model_of_its_own(stack, wants):
    ivy, _, _ = stack
    status, models = get_json(ivy, "/v1/models")
    assert status == 200
    by_id = {m["id"]: m for m in models["data"]}
    assert by_id["legal"]["parent"] in by_id and by_id[by_id["legal"]["parent"]]["parent"] is None
    assert cosines(embed(ivy, "legal"), wants["legal"]).min() >= 0.999
    # The base model is unchanged by the adapter beside it.
    status, body = ivy.post_json("/v1/embeddings", {"input": TEXTS})
    assert status == 200
    base = np.array([d["embedding"] for d in body["data"]])
    assert cosines(base, wants["base"]).min() >= 0.9999
    assert cosines(base, wants["legal"]).max() < 0.99  # the adapter matters


def test_loaded_at_run_time_and_mixed_in_steps(stack, adapters, wants):
    ivy, _, _ = stack
    status, _, text = ivy.request("POST", "/v1/load_lora_adapter",
                                  b'{"lora_name": "medical", "lora_path": "%s"}' % str(adapters["medical"]).encode(),
                                  {"Content-Type": "application/json"})
    assert status == 200 and b"Success" in text, text
    names = ["medical", "legal", None] * 8
    # Concurrent requests of two adapters and the base model share steps.
    with ThreadPoolExecutor(6) as pool:
        got = list(pool.map(lambda m: embed(ivy, m) if m else embed(ivy, None), names))
    for name, vectors in zip(names, got):
        assert cosines(vectors, wants[name or "base"]).min() >= 0.999, name
    # Other APIs pick it by the same name.
    status, body = ivy.post_json("/embed", {"inputs": TEXTS, "model": "medical"})
    assert status == 200 and cosines(body, wants["medical"]).min() >= 0.999
    import grpc

    from tulip.client import load_stubs

    pb2, pb2_grpc = load_stubs("ivy")
    with grpc.insecure_channel(ivy.grpc_target) as channel:
        reply = pb2_grpc.IvyStub(channel).Embed(pb2.EmbedRequest(inputs=TEXTS, model="medical"), timeout=60)
    rows = np.frombuffer(reply.data, dtype="<f4").reshape(len(TEXTS), -1) if reply.data else \
        np.array([e.values for e in reply.embeddings])
    assert cosines(rows, wants["medical"]).min() >= 0.999
    # Per-adapter request counts.
    status, metrics = ivy.get("/metrics")
    assert b'model="medical"' in metrics and b'model="legal"' in metrics


def test_a_replica_that_joins_later_gets_the_run_time_adapter(stack, adapters, wants, minilm_dir, log_dir):
    ivy, first, late_port = stack
    ivy.post_json("/v1/load_lora_adapter", {"lora_name": "medical", "lora_path": str(adapters["medical"])})
    late = Tulip(minilm_dir, port=late_port, log_dir=log_dir, threads=1, lora=f"legal={adapters['legal']}")
    try:
        wait_for(lambda: b'ivy_replica_up{replica="http://127.0.0.1:%d"' % late_port in ivy.get("/metrics")[1]
                 and all(l.endswith(b" 1") for l in ivy.get("/metrics")[1].splitlines()
                         if l.startswith(b"ivy_replica_up{")), "both replicas up", timeout=60)
        with late.client() as c:
            wait_for(lambda: any(a.name == "medical" for a in c.info().adapters), "caught up", timeout=30)
        # Spread over both replicas by load: every one answered.
        with ThreadPoolExecutor(4) as pool:
            for vectors in pool.map(lambda _: embed(ivy, "medical"), range(12)):
                assert cosines(vectors, wants["medical"]).min() >= 0.999
    finally:
        late.stop()


def test_unknown_and_bad_adapters_are_refused_and_nothing_else_is_disturbed(stack, adapters, tmp_path, wants):
    ivy, _, _ = stack
    status, body = ivy.post_json("/v1/embeddings", {"input": TEXTS, "model": "nonexistent"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    bad = lora.random_adapter(ivy_tiny_base(tmp_path), tmp_path / "other-base", r=4, seed=3)
    for fields, says in [({"lora_name": "wrong-base", "lora_path": str(bad)}, "refused"),
                         ({"lora_name": "missing", "lora_path": str(tmp_path / "nowhere")}, "refused"),
                         ({"lora_name": "bad name!", "lora_path": str(bad)}, "must be"),
                         ({"lora_name": "legal", "lora_path": str(bad)}, "loaded from")]:
        status, body = ivy.post_json("/v1/load_lora_adapter", fields)
        assert status == 422 and says in body["error"]["message"], (fields, body)
    assert cosines(embed(ivy, "legal"), wants["legal"]).min() >= 0.999
    # Unloading: the name goes away, the base stays.
    ivy.post_json("/v1/load_lora_adapter", {"lora_name": "medical", "lora_path": str(adapters["medical"])})
    status, _, text = ivy.request("POST", "/v1/unload_lora_adapter", b'{"lora_name": "medical"}',
                                  {"Content-Type": "application/json"})
    assert status == 200 and b"removed" in text
    status, body = ivy.post_json("/v1/embeddings", {"input": TEXTS, "model": "medical"})
    assert status == 404, body
    status, body = ivy.post_json("/v1/unload_lora_adapter", {"lora_name": "medical"})
    assert status == 404, body
    assert cosines(embed(ivy, None), wants["base"]).min() >= 0.9999


def ivy_tiny_base(tmp_path):
    from bench.harness import tiny_models as models

    return models.tiny_bert(tmp_path / "tiny-bert")


def test_loading_and_unloading_under_load_loses_no_request(stack, adapters, wants):
    """Requests for the base model, a loaded adapter and the one being
    loaded and unloaded run throughout: every answer is right or, for the
    adapter while it is away, a clean refusal (404, or 503 while a replica
    that might serve it is down, as for any unknown model)."""
    import threading

    ivy, _, _ = stack
    stop, failures, answered = threading.Event(), [], {"base": 0, "legal": 0, "medical": 0}

    def traffic(model):
        while not stop.is_set():
            status, body = ivy.post_json("/v1/embeddings", {"input": TEXTS, **({"model": model} if model else {})})
            name = model or "base"
            if status in (404, 503) and model == "medical":
                continue
            if status != 200:
                failures.append((name, status, body))
                continue
            got = np.array([d["embedding"] for d in body["data"]])
            if cosines(got, wants[name]).min() < 0.999:
                failures.append((name, "wrong vectors"))
            answered[name] += 1

    threads = [threading.Thread(target=traffic, args=(m,)) for m in (None, "legal", "medical")]
    for t in threads:
        t.start()
    try:
        for _ in range(3):
            status, body = ivy.post_json("/v1/load_lora_adapter",
                                         {"lora_name": "medical", "lora_path": str(adapters["medical"])})
            assert status == 200, body
            served = answered["medical"]
            wait_for(lambda n=served: answered["medical"] > n, "a request served by the loaded adapter", timeout=30)
            status, body = ivy.post_json("/v1/unload_lora_adapter", {"lora_name": "medical"})
            assert status == 200, body
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert failures == [] and min(answered.values()) > 0, (failures, answered)
