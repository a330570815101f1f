"""What ROSE reads from a model directory: family, outputs, pooling,
special tokens, maximum length; and the errors a bad directory gets."""

from __future__ import annotations

import json
import shutil

import pytest

from rose import Engine, ModelLoadError
from rose.config import ModelSpec


def test_kinds_and_info_per_family(bert_dir, xlmr_dir, e5_dir, reranker_bert_dir, qwen3_dir, pplx_dir):
    expect = {
        bert_dir: (["dense"], "mean", 256),
        xlmr_dir: (["dense", "sparse", "multi_vector"], "cls", 8192),
        e5_dir: (["dense"], "mean", 8192),
        reranker_bert_dir: (["score"], "none", 512),
        qwen3_dir: (["dense"], "last", 32768),
        pplx_dir: (["dense"], "mean", 32768),
    }
    for d, (kinds, pooling, max_len) in expect.items():
        spec = ModelSpec.from_dir(d)
        assert ([k.value for k in spec.kinds()], spec.pooling, spec.max_length) == (kinds, pooling, max_len), d


def test_variant_flags(qwen3_dir, pplx_dir, bidir_dir):
    assert ModelSpec.from_dir(qwen3_dir).causal and ModelSpec.from_dir(qwen3_dir).quantization == "none"
    assert not ModelSpec.from_dir(pplx_dir).causal and ModelSpec.from_dir(pplx_dir).quantization == "tanh_int8"
    assert not ModelSpec.from_dir(bidir_dir).causal and ModelSpec.from_dir(bidir_dir).quantization == "none"


def test_special_tokens(xlmr_dir, reranker_bert_dir):
    assert ModelSpec.from_dir(xlmr_dir).special_token_ids() == [0, 1, 2, 3]
    bert = ModelSpec.from_dir(reranker_bert_dir)
    assert bert.token_id("sep_token") == 102 and bert.token_id("cls_token") == 101


def _copy(src, tmp_path, **config_changes):
    out = tmp_path / "model"
    shutil.copytree(src, out)
    cfg = json.loads((out / "config.json").read_text())
    cfg.update(config_changes)
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.mark.parametrize("fixture,changes,message", [
    ("reranker_xlmr_dir", {"id2label": {"0": "a", "1": "b"}}, "2 labels"),
    ("qwen3_dir", {"use_sliding_window": True}, "sliding-window"),
    ("qwen3_dir", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "RoPE scaling"),
    ("pplx_dir", {"embedding_quantization": "int4"}, "embedding_quantization"),
    ("bert_dir", {"model_type": "t5"}, "not supported"),
])
def test_bad_directories_are_clear_errors(request, tmp_path, fixture, changes, message):
    d = _copy(request.getfixturevalue(fixture), tmp_path, **changes)
    with pytest.raises(ModelLoadError, match=message):
        Engine.from_dir(d, device="cpu")


def test_wrong_head_file_is_a_clear_error(xlmr_dir, tmp_path):
    import torch

    d = _copy(xlmr_dir, tmp_path)
    torch.save({"weight": torch.zeros(1, 8), "bias": torch.zeros(1)}, d / "sparse_linear.pt")
    with pytest.raises(ModelLoadError, match="sparse_linear.pt: weight shape"):
        Engine.from_dir(d, device="cpu")


def test_unsupported_output_is_refused(reranker_xlmr_dir):
    from rose import InvalidBatchError

    e = Engine.from_dir(reranker_xlmr_dir, device="cpu")
    with pytest.raises(InvalidBatchError, match="produces score outputs, not dense"):
        e.embed([[0, 5, 2]], kind="dense")


def test_the_engine_refuses_malformed_batches(tmp_path):
    """The last check before a kernel: ids outside the vocabulary (negative
    ones too), empty and over-long sequences, and cu_seqlens that do not
    cover the batch."""
    import json

    import numpy as np

    from rose import Engine, InvalidBatchError
    from rose.interface import Batch

    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "null", "hidden_size": 8, "vocab_size": 100, "max_position_embeddings": 16}))
    engine = Engine.from_dir(tmp_path, device="cpu")
    assert engine.embed([[1, 2, 3], [4]]).shape == (2, 8)
    for seqs, words in (([[1, 100]], "token ids"), ([[1, 2] * 9], "exceeds the maximum of 16")):
        with pytest.raises(InvalidBatchError, match=words):
            engine.step(Batch.from_lists(seqs))
    negative = Batch.from_lists([[1, 2]])
    negative.numpy_field("ids")[1] = -5
    with pytest.raises(InvalidBatchError, match="token ids"):
        engine.step(negative)
    empty = Batch.from_lists([[1, 2], [3]])
    cu = empty.numpy_field("cu")
    cu[1] = 3  # the second sequence now has no tokens
    with pytest.raises(InvalidBatchError, match="at least one token"):
        engine.step(empty)
    assert np.all(engine.embed([[5]]).numpy() == 0)
