"""Every output kind served end to end through a real Tulip process (gRPC,
scheduler, PyO3 step, output stage) on the random-weight XLM-R (BGE-M3
layout), Qwen3 (causal and pplx-style) and reranker models, compared with
the in-process engine whose outputs the fidelity tests check against
transformers."""

from __future__ import annotations

import grpc
import numpy as np
import pytest
import torch

from rose import Engine
from tests.support.servers import Tulip

from .conftest import tokenize


@pytest.fixture(scope="module")
def served(request, log_dir):
    """(client, in-process engine, token ids) for a model fixture."""
    procs = {}

    def get(fixture: str):
        if fixture not in procs:
            model_dir = request.getfixturevalue(fixture)
            proc = Tulip(str(model_dir), log_dir=log_dir, threads=1)
            procs[fixture] = (proc, proc.client(), Engine.from_dir(model_dir, device="cpu", dtype="float32"))
        return procs[fixture][1:]

    yield get
    for proc, client, _ in procs.values():
        client.close()
        proc.stop()


def _seqs(fixture_dir, texts):
    return tokenize(fixture_dir, texts[:12])


def test_xlmr_serves_dense_sparse_multi_vector(served, xlmr_dir, texts):
    client, engine, seqs = *served("xlmr_dir"), _seqs(xlmr_dir, texts)
    info = client.info()
    pb = client.pb2
    assert list(info.kinds) == [pb.OUTPUT_KIND_DENSE, pb.OUTPUT_KIND_SPARSE, pb.OUTPUT_KIND_MULTI_VECTOR]
    assert (info.dimension, info.max_input_length, info.multi_vector_dimension) == (32, 8192, 32)

    dense = client.embed(seqs, kind="dense")
    np.testing.assert_allclose(dense.values, engine.embed(seqs).numpy(), atol=1e-5)

    sparse = client.embed(seqs, kind="sparse")
    weights = engine.embed(seqs, kind="sparse")[:, 0].tolist()
    start = 0
    for got, s in zip(sparse.values, seqs):
        want: dict[int, float] = {}
        for t, w in zip(s, weights[start:start + len(s)]):
            if w > 0:
                want[t] = max(w, want.get(t, 0.0))
        start += len(s)
        assert set(got) == set(want) and not {0, 1, 2, 3} & set(got)
        assert all(abs(got[t] - w) <= 1e-5 * max(1.0, w) for t, w in want.items())

    mv = client.embed(seqs, kind="multi_vector")
    rows = engine.embed(seqs, kind="multi_vector").numpy()
    assert [m.shape for m in mv.values] == [(len(s) - 1, 32) for s in seqs]
    np.testing.assert_allclose(np.concatenate(mv.values), rows, atol=1e-5)


def test_qwen3_serves_dense_with_matryoshka(served, qwen3_dir, texts):
    client, engine, seqs = *served("qwen3_dir"), _seqs(qwen3_dir, texts)
    assert list(client.info().kinds) == [client.pb2.OUTPUT_KIND_DENSE]
    full = client.embed(seqs)
    np.testing.assert_allclose(full.values, engine.embed(seqs).numpy(), atol=1e-5)
    short = client.embed(seqs, dimensions=16)
    want = torch.nn.functional.normalize(engine.embed(seqs, normalize=[False] * len(seqs))[:, :16], dim=1)
    np.testing.assert_allclose(short.values, want.numpy(), atol=1e-5)
    with pytest.raises(grpc.RpcError) as e:
        client.embed(seqs, kind="sparse")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_pplx_serves_int8_valued_vectors(served, pplx_dir, texts):
    client, engine, seqs = *served("pplx_dir"), _seqs(pplx_dir, texts)
    assert not client.info().normalize_default
    out = client.embed(seqs)
    assert np.array_equal(out.values, np.round(out.values)) and np.abs(out.values).max() <= 127
    np.testing.assert_array_equal(out.values, engine.embed(seqs).numpy())


def test_reranker_serves_scores(served, reranker_xlmr_dir, texts):
    from tokenizers import Tokenizer

    client, engine = served("reranker_xlmr_dir")
    tok = Tokenizer.from_file(str(reranker_xlmr_dir / "tokenizer.json"))
    seqs = [e.ids for e in tok.encode_batch([("which mountain is highest", t) for t in texts[:8]])]
    assert list(client.info().kinds) == [client.pb2.OUTPUT_KIND_SCORE]
    want = engine.embed(seqs, kind="score").numpy()
    np.testing.assert_allclose(client.embed(seqs, kind="score").values[:, 0], want[:, 1], atol=1e-5)
    np.testing.assert_allclose(client.embed(seqs, kind="score", raw_scores=True).values[:, 0], want[:, 0], atol=1e-5)
    with pytest.raises(grpc.RpcError) as e:
        client.embed(seqs, kind="dense")
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


def test_qwen3_reranker_serves_scores(served, qwen3_reranker_dir, texts):
    from tests.support.reference import qwen3_rerank_ids

    client, engine = served("qwen3_reranker_dir")
    seqs = qwen3_rerank_ids(qwen3_reranker_dir, "which mountain is highest", texts[:6])
    assert list(client.info().kinds) == [client.pb2.OUTPUT_KIND_SCORE]
    want = engine.embed(seqs, kind="score").numpy()
    np.testing.assert_allclose(client.embed(seqs, kind="score").values[:, 0], want[:, 1], atol=1e-5)
    np.testing.assert_allclose(client.embed(seqs, kind="score", raw_scores=True).values[:, 0], want[:, 0], atol=1e-5)


def test_modernbert_reranker_serves_scores(served, modernbert_reranker_dir, texts):
    from tokenizers import Tokenizer

    client, engine = served("modernbert_reranker_dir")
    tok = Tokenizer.from_file(str(modernbert_reranker_dir / "tokenizer.json"))
    seqs = [e.ids for e in tok.encode_batch([("which mountain is highest", t) for t in texts[:8]])]
    assert list(client.info().kinds) == [client.pb2.OUTPUT_KIND_SCORE]
    want = engine.embed(seqs, kind="score").numpy()
    np.testing.assert_allclose(client.embed(seqs, kind="score").values[:, 0], want[:, 1], atol=1e-5)
    np.testing.assert_allclose(client.embed(seqs, kind="score", raw_scores=True).values[:, 0], want[:, 0], atol=1e-5)
