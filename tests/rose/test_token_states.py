"""``token_states`` (TEI's ``/embed_all`` for any model): the encoder's last
hidden state for every token, special tokens included, against
``transformers``' ``last_hidden_state`` on the same weights (CPU, fp32)."""

from __future__ import annotations

import pytest
import torch

from rose import Engine, InvalidBatchError
from rose.interface import OutputKind
from tests.support import reference as ref

from .conftest import tokenize


def engine(model_dir) -> Engine:
    return Engine.from_dir(model_dir, device="cpu", dtype="float32")


@pytest.mark.parametrize("fixture", ["bert_dir", "xlmr_dir", "minilm_dir"])
def test_token_states_match_last_hidden_state(request, fixture, texts):
    model_dir = request.getfixturevalue(fixture)
    seqs = tokenize(model_dir, texts)
    e = engine(model_dir)
    hidden = int(e.spec.hidden_size)
    assert e.info.token_states_dimension == hidden and "token_states" not in e.info.kinds
    got = e.embed(seqs, OutputKind.TOKEN_STATES)
    want = torch.cat(ref.encoder_hidden(model_dir, seqs))
    assert got.shape == (sum(map(len, seqs)), hidden) == want.shape
    assert torch.allclose(got, want.float(), atol=1e-4, rtol=1e-4), (got - want).abs().max()


def test_token_states_refused_without_an_embedding_head(reranker_bert_dir):
    e = engine(reranker_bert_dir)
    assert e.info.token_states_dimension == 0
    with pytest.raises(InvalidBatchError):
        e.embed([[101, 102]], OutputKind.TOKEN_STATES)


def test_token_states_on_static_buffers(bert_dir, texts):
    """Through the static-buffer path (bucketed, with a filler segment whose
    rows are dropped) the states equal the eager ones on every pass."""
    seqs = tokenize(bert_dir, texts[:5])
    want = engine(bert_dir).embed(seqs, OutputKind.TOKEN_STATES)
    e = Engine.from_dir(bert_dir, device="cpu", dtype="float32", static_on_cpu=True)
    for _ in range(3):
        got = e.embed(seqs, OutputKind.TOKEN_STATES)
        assert got.shape == want.shape and (got - want).abs().max() <= 1e-4
    assert e.runner.stats.steps["replay"] == 1


def test_span_pooling_names_a_head_that_only_pools(minilm_dir, xlmr_dir, reranker_bert_dir, tmp_path):
    """What a host may pool over token-state spans itself (late chunking):
    the one pooling mode of a head with nothing after it, else nothing."""
    from bench.harness import tiny_models as models

    assert engine(minilm_dir).info.span_pooling == "mean"
    assert engine(xlmr_dir).info.span_pooling == "cls"
    assert engine(reranker_bert_dir).info.span_pooling == ""
    dense = models.st_pipeline(tmp_path / "st", models.tiny_bert(tmp_path / "bert"), dense=((96, "Tanh"),))
    assert engine(dense).info.span_pooling == ""
