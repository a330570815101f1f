"""The sentence-transformers pipeline (Pooling modes, Dense, Normalize,
prompts) against sentence-transformers itself on models it saved, and the
load errors for what ROSE does not implement."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from bench.harness.tiny_models import st_pipeline
from rose import Engine, ModelLoadError
from tests.support.reference import assert_close_vectors


def _st_ids_and_vectors(model_dir, texts):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir), device="cpu")
    feats = st.tokenize(texts)
    seqs = [ids[m.bool()].tolist() for ids, m in zip(feats["input_ids"], feats["attention_mask"])]
    return seqs, st.encode(texts, convert_to_tensor=True, prompt_name=None).float()


@pytest.mark.parametrize("pooling,dense,normalize", [
    ("mean", ((48, "Tanh"),), True),
    ("cls", ((40, "Identity"), (24, "Tanh")), True),
    ("max", ((32, "ReLU"),), False),
    ("lasttoken", (), True),
    ("weightedmean", ((16, "GELU"),), True),
    ("mean_sqrt_len_tokens", (), False),
    (("cls", "mean"), ((32, "Tanh"),), True),
])
def test_pipeline_matches_sentence_transformers(tmp_path, bert_dir, texts, pooling, dense, normalize):
    d = st_pipeline(tmp_path / "st", bert_dir, pooling=pooling, dense=dense, normalize=normalize)
    seqs, want = _st_ids_and_vectors(d, texts)
    e = Engine.from_dir(d, device="cpu", dtype="float32")
    assert e.info.dimension == (dense[-1][0] if dense else 64 * (2 if isinstance(pooling, tuple) else 1))
    assert e.info.normalize_default == normalize
    assert_close_vectors(e.embed(seqs), want)


def test_dense_changes_the_vectors(tmp_path, bert_dir, texts):
    """Skipping the Dense module (the old behaviour) must fail the check."""
    d = st_pipeline(tmp_path / "st", bert_dir, dense=((64, "Tanh"),))
    seqs, want = _st_ids_and_vectors(d, texts)
    modules = json.loads((d / "modules.json").read_text())
    (d / "modules.json").write_text(json.dumps([m for m in modules if not m["type"].endswith("Dense")]))
    got = Engine.from_dir(d, device="cpu", dtype="float32").embed(seqs)
    assert torch.nn.functional.cosine_similarity(got, want).min() < 0.99


def test_dense_weights_from_pytorch_bin(tmp_path, bert_dir, texts):
    d = st_pipeline(tmp_path / "st", bert_dir, safe=False)
    assert list(d.glob("2_Dense/pytorch_model.bin")) and not list(d.glob("2_Dense/*.safetensors"))
    seqs, want = _st_ids_and_vectors(d, texts)
    assert_close_vectors(Engine.from_dir(d, device="cpu", dtype="float32").embed(seqs), want)


def test_prompts_are_in_the_info(tmp_path, bert_dir):
    prompts = {"query": "query: ", "document": "passage: "}
    d = st_pipeline(tmp_path / "st", bert_dir, prompts=prompts, default_prompt_name="query")
    info = Engine.from_dir(d, device="cpu").info
    assert (info.prompts, info.default_prompt_name) == (prompts, "query")
    assert info.to_dict()["prompts"] == prompts


def _edit_modules(d, change):
    modules = json.loads((d / "modules.json").read_text())
    (d / "modules.json").write_text(json.dumps(change(modules)))


def test_unknown_module_is_a_load_error_naming_it(tmp_path, bert_dir):
    d = st_pipeline(tmp_path / "st", bert_dir)
    _edit_modules(d, lambda ms: ms[:2] + [{"idx": 2, "name": "2", "path": "2_LayerNorm",
                                          "type": "sentence_transformers.models.LayerNorm"}] + ms[2:])
    with pytest.raises(ModelLoadError, match=r"module 'sentence_transformers.models.LayerNorm' \(2_LayerNorm\)"):
        Engine.from_dir(d, device="cpu")


@pytest.mark.parametrize("edit,message", [
    (lambda c: c.update(activation_function="torch.nn.modules.activation.Softplus"), "activation.*Softplus"),
    (lambda c: c.update(in_features=63), "in_features 63, but its input has 64"),
    (lambda c: c.update(use_residual=True), "use_residual"),
])
def test_bad_dense_is_a_load_error(tmp_path, bert_dir, edit, message):
    d = st_pipeline(tmp_path / "st", bert_dir)
    cfg = json.loads((d / "2_Dense" / "config.json").read_text())
    edit(cfg)
    (d / "2_Dense" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match=message):
        Engine.from_dir(d, device="cpu")


def test_missing_dense_weights_is_a_load_error(tmp_path, bert_dir):
    d = st_pipeline(tmp_path / "st", bert_dir)
    for f in (d / "2_Dense").glob("model.safetensors"):
        f.unlink()
    with pytest.raises(ModelLoadError, match="neither model.safetensors nor pytorch_model.bin"):
        Engine.from_dir(d, device="cpu")


def test_pooling_errors(tmp_path, bert_dir):
    d = st_pipeline(tmp_path / "st", bert_dir)
    cfg_path = d / "1_Pooling" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg_path.write_text(json.dumps({**cfg, "include_prompt": False}))
    with pytest.raises(ModelLoadError, match="include_prompt"):
        Engine.from_dir(d, device="cpu")
    cfg_path.write_text(json.dumps({**cfg, "pooling_mode": "median"}))
    with pytest.raises(ModelLoadError, match="pooling mode.*median"):
        Engine.from_dir(d, device="cpu")


def test_legacy_pooling_flags(tmp_path, bert_dir, texts):
    """Configs written by older sentence-transformers (pooling_mode_* flags)
    read as it reads them."""
    d = tmp_path / "legacy"
    shutil.copytree(st_pipeline(tmp_path / "st", bert_dir, pooling=("cls", "max")), d)
    cfg_path = d / "1_Pooling" / "config.json"
    cfg_path.write_text(json.dumps({"word_embedding_dimension": 64, "pooling_mode_cls_token": True,
                                    "pooling_mode_max_tokens": True, "pooling_mode_mean_tokens": False}))
    seqs, want = _st_ids_and_vectors(d, texts)
    e = Engine.from_dir(d, device="cpu", dtype="float32")
    assert e.info.pooling == "cls+max"
    assert_close_vectors(e.embed(seqs), want)


def test_tokenizer_identity_is_in_the_info(tmp_path, bert_dir, xlmr_dir):
    """The tokenizer file and its content hash: equal for the same
    tokenizer, different for another."""
    import hashlib

    a = Engine.from_dir(bert_dir, device="cpu").info
    assert a.tokenizer_file == str(bert_dir / "tokenizer.json")
    assert a.tokenizer_sha256 == hashlib.sha256((bert_dir / "tokenizer.json").read_bytes()).hexdigest()
    copy = tmp_path / "copy"
    shutil.copytree(bert_dir, copy)
    assert Engine.from_dir(copy, device="cpu").info.tokenizer_sha256 == a.tokenizer_sha256
    assert Engine.from_dir(xlmr_dir, device="cpu").info.tokenizer_sha256 != a.tokenizer_sha256
