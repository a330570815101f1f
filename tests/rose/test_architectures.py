"""Fidelity of the architectures beyond BERT/XLM-R/Qwen3, against
``transformers`` on seeded random weights with the real models' shapes
(fewer layers), through ROSE's engine (CPU, fp32)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from bench.harness.tiny_models import tiny_mpnet
from rose import Engine
from tests.support import reference as ref
from tests.support.reference import assert_close_vectors, qwen3_rerank_ids

from .conftest import tokenize


@pytest.fixture(scope="module")
def mpnet_dir(models_root):
    return tiny_mpnet(models_root / "mpnet")


def test_mpnet_dense(mpnet_dir, texts):
    seqs = tokenize(mpnet_dir, texts)
    # Past 128 tokens the relative buckets saturate; id 1 (MPNet's padding
    # index) inside a sequence sits at the padding position.
    long = tokenize(mpnet_dir, [" ".join(texts)], max_length=300)
    seqs += long + [[101, 2023, 1, 2003, 102]]
    assert max(map(len, seqs)) == 300
    e = Engine.from_dir(mpnet_dir, device="cpu", dtype="float32")
    assert (e.info.architecture, e.info.pooling, e.info.max_input_length, e.info.dimension) == ("mpnet", "mean", 384, 768)
    want = torch.stack([F.normalize(h.mean(0), dim=0) for h in ref.encoder_hidden(mpnet_dir, seqs)])
    assert_close_vectors(e.embed(seqs), want)


def test_mpnet_matches_sentence_transformers(mpnet_dir, texts):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(mpnet_dir), device="cpu")
    feats = st.tokenize(texts)
    seqs = [ids[m.bool()].tolist() for ids, m in zip(feats["input_ids"], feats["attention_mask"])]
    got = Engine.from_dir(mpnet_dir, device="cpu", dtype="float32").embed(seqs)
    assert_close_vectors(got, st.encode(texts, convert_to_tensor=True).float())


def test_mpnet_relative_bias_matters(mpnet_dir, texts, tmp_path):
    """Zeroing the relative bias table must break the match (the check
    above would catch a bias that is ignored)."""
    import shutil

    from safetensors.torch import load_file, save_file

    d = tmp_path / "mpnet-nobias"
    shutil.copytree(mpnet_dir, d)
    w = load_file(str(d / "model.safetensors"))
    w["encoder.relative_attention_bias.weight"].zero_()
    save_file(w, str(d / "model.safetensors"), metadata={"format": "pt"})
    seqs = tokenize(mpnet_dir, texts)
    with_bias = Engine.from_dir(mpnet_dir, device="cpu", dtype="float32").embed(seqs)
    without = Engine.from_dir(d, device="cpu", dtype="float32").embed(seqs)
    assert F.cosine_similarity(with_bias, without).min() < 0.999


def test_mpnet_half_precision_tracks_fp32(mpnet_dir, texts):
    seqs = tokenize(mpnet_dir, texts[:6])
    full = Engine.from_dir(mpnet_dir, device="cpu", dtype="float32").embed(seqs)
    half = Engine.from_dir(mpnet_dir, device="cpu", dtype="bfloat16").embed(seqs)
    assert F.cosine_similarity(half.double(), full.double()).min() >= 0.99


@pytest.mark.parametrize("fixture", ["mpnet_dir", "modernbert_dir", "gemma_dir", "nomic_dir"])
def test_static_buffers_match_eager(request, fixture, texts):
    """The padded (bucketed) static-buffer path, with its filler segment,
    gives the eager vectors on every pass (warm-up, capture, replay)."""
    model_dir = request.getfixturevalue(fixture)
    seqs = tokenize(model_dir, texts[:5])
    want = Engine.from_dir(model_dir, device="cpu", dtype="float32").embed(seqs)
    e = Engine.from_dir(model_dir, device="cpu", dtype="float32", static_on_cpu=True)
    for _ in range(3):
        assert_close_vectors(e.embed(seqs), want)
    assert e.runner.stats.steps["replay"] == 1


@pytest.mark.parametrize("arch", ["bert", "xlm-roberta"])
def test_sequence_classifier_logits(arch, models_root, texts):
    """``ForSequenceClassification`` with several labels: every label's
    logit within 1e-3 of transformers, the names from id2label."""
    from tokenizers import Tokenizer

    from bench.harness.tiny_models import tiny_reranker

    labels = ("negative", "neutral", "positive")
    d = tiny_reranker(models_root / f"classifier-{arch}", seed=6, arch=arch, labels=labels)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.enable_truncation(256)
    encs = tok.encode_batch(texts) + tok.encode_batch([("is this a pair?", texts[0])])
    seqs, types = [e.ids for e in encs], [e.type_ids for e in encs]
    e = Engine.from_dir(d, device="cpu", dtype="float32")
    assert (e.info.kinds, e.info.labels, e.info.dimension) == (("classify",), labels, 3)
    got = e.embed(seqs, kind="classify")
    want = ref.cross_encoder_logits(d, seqs, types, all_labels=True)
    assert got.shape == want.shape == (len(seqs), 3)
    assert (got - want).abs().max() <= 1e-3
    assert torch.equal(got.argmax(1), want.argmax(1))


@pytest.fixture(scope="module")
def modernbert_dir(models_root):
    from bench.harness.tiny_models import tiny_modernbert

    return tiny_modernbert(models_root / "modernbert")


def _long_seqs(model_dir, texts):
    """Real sentences plus one of 300 tokens, so local layers' 64-token
    windows cut attention."""
    return tokenize(model_dir, texts) + tokenize(model_dir, [" ".join(texts)], max_length=300)


def test_modernbert_dense(modernbert_dir, texts):
    seqs = _long_seqs(modernbert_dir, texts)
    e = Engine.from_dir(modernbert_dir, device="cpu", dtype="float32")
    assert (e.info.architecture, e.info.pooling, e.info.dimension) == ("modernbert", "cls", 768)
    assert e.model.kinds_per_layer == ["full_attention", "sliding_attention", "sliding_attention"]
    want = torch.stack([F.normalize(h[0], dim=0) for h in ref.encoder_hidden(modernbert_dir, seqs)])
    assert_close_vectors(e.embed(seqs), want)
    # Token-level: every hidden state, not just the pooled one.
    assert_close_vectors(_hidden(e, seqs), torch.cat(ref.encoder_hidden(modernbert_dir, seqs)))


def _hidden(e: Engine, seqs) -> torch.Tensor:
    """The engine model's last hidden states [T, H] for a ragged batch."""
    from rose.interface import Batch
    from rose.step.inputs import step_inputs

    b = Batch.from_lists(seqs)
    lengths = b.lengths
    with torch.inference_mode():
        x = step_inputs(b.arena, b.layout, e.backend, e.model.causal, lengths, max(lengths))
        return e.model.encode(x)


def test_modernbert_local_window_matters(modernbert_dir, models_root, texts):
    """With a window wider than the input, sequences longer than the
    window (65 tokens: 64 either side) change and the others do not: the
    window mask is really applied, and only where it cuts."""
    from bench.harness.tiny_models import tiny_modernbert

    wide = tiny_modernbert(models_root / "modernbert-wide", local_attention=4096)
    seqs = _long_seqs(modernbert_dir, texts)
    a = Engine.from_dir(modernbert_dir, device="cpu", dtype="float32").embed(seqs)
    b = Engine.from_dir(wide, device="cpu", dtype="float32").embed(seqs)
    cos = F.cosine_similarity(a, b)
    long = torch.tensor([len(s) > 65 for s in seqs])
    assert long.any() and (~long).any()
    assert cos[long].max() < 0.9999 and cos[~long].min() > 0.99999


@pytest.mark.parametrize("arch,strategy", [("bert", "max"), ("xlm-roberta", "max"), ("bert", "sum")])
def test_splade_matches_sentence_transformers(arch, strategy, models_root, texts):
    """The same non-zero vocabulary entries as sentence-transformers'
    SparseEncoder, weights within 1e-3; and the same as the formula on
    transformers' masked-LM logits."""
    from sentence_transformers import SparseEncoder

    from bench.harness.tiny_models import tiny_splade

    d = tiny_splade(models_root / f"splade-{arch}-{strategy}", seed=8, arch=arch, strategy=strategy)
    st = SparseEncoder(str(d), device="cpu")
    feats = st.tokenize(texts)
    seqs = [ids[m.bool()].tolist() for ids, m in zip(feats["input_ids"], feats["attention_mask"])]
    want = st.encode(texts, convert_to_tensor=True).to_dense().float()
    e = Engine.from_dir(d, device="cpu", dtype="float32")
    assert e.info.kinds == ("sparse_vocab",) and e.info.dimension == e.info.vocab_size
    assert e.info.pooling == f"splade_{strategy}"
    got = e.embed(seqs, kind="sparse_vocab")
    e.model.chunk_tokens = 7  # many slices, cut mid-sequence: the same result
    assert torch.allclose(e.embed(seqs, kind="sparse_vocab"), got, rtol=1e-5, atol=1e-5)
    assert got.shape == want.shape
    assert torch.equal(got > 0, want > 0) and (want > 0).any()
    assert (got - want).abs().max() <= 1e-3
    # Independently of sentence-transformers: log1p(relu(logits)), pooled.
    from transformers import AutoModelForMaskedLM

    mlm = AutoModelForMaskedLM.from_pretrained(str(d), attn_implementation="eager").eval()
    with torch.inference_mode():
        rows = []
        for s in seqs[:4]:
            w = torch.log1p(torch.relu(mlm(input_ids=torch.tensor([s])).logits[0]))
            rows.append(w.max(0).values if strategy == "max" else w.sum(0))
    assert (got[:4] - torch.stack(rows)).abs().max() <= 1e-3


@pytest.mark.parametrize("tied,st_files", [(True, False), (False, False), (True, True)])
def test_qwen3_reranker_scores(tied, st_files, models_root, texts):
    """logit(yes) - logit(no) at the last token of transformers'
    Qwen3ForCausalLM, within 1e-3, and its sigmoid; with sentence-transformers
    files, the same as CrossEncoder.predict."""
    from transformers import AutoModelForCausalLM

    from bench.harness.tiny_models import tiny_qwen3_reranker

    d = tiny_qwen3_reranker(models_root / f"qwen3-rerank-{tied}-{st_files}", seed=9, tied=tied, st_files=st_files)
    seqs = qwen3_rerank_ids(d, "what is the capital of france", texts[:10])
    e = Engine.from_dir(d, device="cpu", dtype="float32")
    assert e.info.kinds == ("score",) and e.spec.causal
    got = e.embed(seqs, kind="score")
    lm = AutoModelForCausalLM.from_pretrained(str(d), attn_implementation="eager").eval()
    yes, no = e.spec.score_tokens
    with torch.inference_mode():
        last = torch.stack([lm(input_ids=torch.tensor([s])).logits[0, -1] for s in seqs])
    raw = last[:, yes] - last[:, no]
    assert (got[:, 0] - raw).abs().max() <= 1e-3
    assert torch.allclose(got[:, 1], torch.softmax(last[:, [no, yes]], dim=1)[:, 1], atol=1e-4)
    assert raw.std() > 1e-2, "scores must differ between documents for the check to mean anything"
    if st_files:
        from sentence_transformers import CrossEncoder

        score = CrossEncoder(str(d), device="cpu")[-1]
        assert (type(score).__name__, (score.true_token_id, score.false_token_id)) == ("LogitScore", (yes, no))


@pytest.fixture(scope="module")
def gemma_dir(models_root):
    """EmbeddingGemma shape with a 32-token sliding window, so real
    sentences cross it (the real model's is 512)."""
    from bench.harness.tiny_models import tiny_embeddinggemma

    return tiny_embeddinggemma(models_root / "embeddinggemma", seed=10, sliding_window=32)


def test_embeddinggemma_matches_sentence_transformers(gemma_dir, texts):
    """Transformer (bidirectional Gemma3, sliding + global layers) + mean
    pooling + two Dense + Normalize, and Matryoshka truncation, as
    sentence-transformers computes them."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(gemma_dir), device="cpu")
    feats = st.tokenize(texts)
    seqs = [ids[m.bool()].tolist() for ids, m in zip(feats["input_ids"], feats["attention_mask"])]
    assert max(map(len, seqs)) > 17, "some sequences must cross the window (16 either side)"
    e = Engine.from_dir(gemma_dir, device="cpu", dtype="float32")
    assert (e.info.architecture, e.info.pooling, e.info.dimension) == ("gemma3-text", "mean", 768)
    assert e.info.prompts["query"] == "task: search result | query: "
    assert_close_vectors(e.embed(seqs), st.encode(texts, convert_to_tensor=True).float())
    # Matryoshka: first 256 values, renormalised.
    want = st.encode(texts, convert_to_tensor=True, truncate_dim=256, normalize_embeddings=True).float()
    assert_close_vectors(e.embed(seqs, dimensions=[256] * len(seqs))[:, :256], want)


def test_embeddinggemma_hidden_states_match_transformers(gemma_dir, texts):
    from transformers import Gemma3TextModel

    seqs = tokenize(gemma_dir, texts)
    model = Gemma3TextModel.from_pretrained(str(gemma_dir), attn_implementation="eager").eval()
    with torch.inference_mode():
        want = torch.cat([model(input_ids=torch.tensor([s])).last_hidden_state[0] for s in seqs])
    e = Engine.from_dir(gemma_dir, device="cpu", dtype="float32")
    assert_close_vectors(_hidden(e, seqs), want)


def test_embeddinggemma_window_matters(gemma_dir, models_root, texts):
    from bench.harness.tiny_models import tiny_embeddinggemma

    wide = tiny_embeddinggemma(models_root / "embeddinggemma-wide", seed=10, sliding_window=4096)
    seqs = tokenize(gemma_dir, texts)
    a = Engine.from_dir(gemma_dir, device="cpu", dtype="float32").embed(seqs)
    b = Engine.from_dir(wide, device="cpu", dtype="float32").embed(seqs)
    cos = F.cosine_similarity(a, b)
    long = torch.tensor([len(s) > 17 for s in seqs])
    assert long.any() and (~long).any()
    assert cos[long].max() < 0.9999 and cos[~long].min() > 0.99999


@pytest.fixture(scope="module")
def nomic_dir(models_root):
    from bench.harness.tiny_models import tiny_nomic_bert

    return tiny_nomic_bert(models_root / "nomic-bert", seed=11)


def test_nomic_bert_matches_sentence_transformers(nomic_dir, texts):
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(nomic_dir), device="cpu")
    feats = st.tokenize(texts)
    seqs = [ids[m.bool()].tolist() for ids, m in zip(feats["input_ids"], feats["attention_mask"])]
    e = Engine.from_dir(nomic_dir, device="cpu", dtype="float32")
    assert (e.info.architecture, e.info.pooling, e.info.max_input_length) == ("nomic-bert", "mean", 2048)
    assert e.info.prompts == {"query": "search_query: ", "document": "search_document: "}
    assert_close_vectors(e.embed(seqs), st.encode(texts, convert_to_tensor=True).float())
    want = torch.cat(ref.encoder_hidden(nomic_dir, seqs))
    assert_close_vectors(_hidden(e, seqs), want)


def test_nomic_bert_remote_code_layout_is_refused(nomic_dir, tmp_path):
    import json
    import shutil

    from rose import ModelLoadError

    d = tmp_path / "nomic-remote"
    shutil.copytree(nomic_dir, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["n_embd"] = cfg.pop("hidden_size")
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="remote-code layout"):
        Engine.from_dir(d, device="cpu")


@pytest.mark.parametrize("kind", ["classify", "sparse_vocab", "score"])
def test_new_output_kinds_on_static_buffers(kind, models_root, texts):
    """The new output kinds through the static-buffer path (bucketed, with
    a filler segment) equal their eager outputs on every pass."""
    from bench.harness.tiny_models import tiny_qwen3_reranker, tiny_reranker, tiny_splade

    if kind == "classify":
        d = tiny_reranker(models_root / "static-classifier", seed=12, arch="bert", labels=("a", "b", "c"))
    elif kind == "sparse_vocab":
        d = tiny_splade(models_root / "static-splade", seed=12)
    else:
        d = tiny_qwen3_reranker(models_root / "static-qwen3-rerank", seed=12)
    seqs = tokenize(d, texts[:5])
    want = Engine.from_dir(d, device="cpu", dtype="float32").embed(seqs, kind=kind)
    e = Engine.from_dir(d, device="cpu", dtype="float32", static_on_cpu=True)
    for _ in range(3):
        got = e.embed(seqs, kind=kind)
        assert got.shape == want.shape and (got - want).abs().max() <= 1e-4
    assert e.runner.stats.steps["replay"] == 1


@pytest.mark.parametrize("labels,pooling", [(("score",), "cls"), (("a", "b", "c"), "mean")])
def test_modernbert_cross_encoder_logits(labels, pooling, models_root, texts):
    """ModernBertForSequenceClassification: one label as a score (the
    gte-reranker-modernbert shape), several as classify; logits within 1e-3
    of transformers, pairs long enough to cross the local window."""
    from tokenizers import Tokenizer

    from bench.harness.tiny_models import tiny_modernbert

    d = tiny_modernbert(models_root / f"modernbert-ce-{len(labels)}", seed=13, labels=labels,
                        classifier_pooling=pooling)
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.enable_truncation(300)
    encs = tok.encode_batch([("which mountain is the highest in the alps", t) for t in texts]
                            + [("long", " ".join(texts))])
    seqs, types = [e.ids for e in encs], [e.type_ids for e in encs]
    assert max(map(len, seqs)) > 65
    e = Engine.from_dir(d, device="cpu", dtype="float32")
    kind = "score" if len(labels) == 1 else "classify"
    assert e.info.kinds == (kind,)
    got = e.embed(seqs, kind=kind)
    want = ref.cross_encoder_logits(d, seqs, types, all_labels=True)
    logits = got[:, :1] if kind == "score" else got
    assert logits.shape == want.shape and (logits - want).abs().max() <= 1e-3
    if kind == "score":
        assert torch.allclose(got[:, 1], torch.sigmoid(want[:, 0]), atol=1e-4)


# deberta-v3-base's settings, and the DeBERTa-v2 options they leave off (the
# v2 ConvLayer aside, which is refused): separate position projections,
# one relative term, absolute positions and token types.
DEBERTA_VARIANTS = {
    "v3": {},
    "v2-options": dict(share_att_key=False, pos_att_type=["c2p"], position_biased_input=True, type_vocab_size=2),
}


@pytest.mark.parametrize("labels,variant", [(("score",), "v3"), (("negative", "neutral", "positive"), "v3"),
                                            (("a", "b"), "v2-options")])
def test_deberta_v2_logits(labels, variant, models_root, texts):
    """DebertaV2ForSequenceClassification: one label as a score (the
    mxbai-rerank shape), several as classify; logits within 1e-3 of
    transformers on a batch with a pair past the 128 exact buckets (so the
    log buckets count) and on short pairs alone (fewer table rows)."""
    from tokenizers import Tokenizer

    from bench.harness.tiny_models import tiny_deberta_v2

    d = tiny_deberta_v2(models_root / f"deberta-{variant}-{len(labels)}", seed=15, labels=labels,
                        **DEBERTA_VARIANTS[variant])
    tok = Tokenizer.from_file(str(d / "tokenizer.json"))
    tok.enable_truncation(300)
    encs = tok.encode_batch([("which mountain is the highest in the alps", t) for t in texts]
                            + [("long", " ".join(texts))])
    seqs, types = [e.ids for e in encs], [e.type_ids for e in encs]
    assert max(map(len, seqs)) == 300
    e = Engine.from_dir(d, device="cpu", dtype="float32")
    kind = "score" if len(labels) == 1 else "classify"
    named = labels if kind == "classify" else ()  # a score has no label names
    assert (e.info.kinds, e.info.labels, e.info.architecture) == ((kind,), named, "deberta-v2")
    want = ref.cross_encoder_logits(d, seqs, types, all_labels=True)
    assert want.std() > 1e-2, "logits must differ between inputs for the check to mean anything"
    for rows in (slice(None), slice(0, 6)):
        got = e.embed(seqs[rows], kind=kind)
        logits = got[:, :len(labels)]
        assert logits.shape == want[rows].shape and (logits - want[rows]).abs().max() <= 1e-3
        if kind == "score":
            assert torch.allclose(got[:, 1], torch.sigmoid(want[rows, 0]), atol=1e-4)


def test_deberta_log_buckets_match_transformers():
    """The bucketed distances equal transformers' make_log_bucket_position,
    and the table rows a step slices are exactly the ones it reaches."""
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    from rose.models.deberta_v2 import RelativeSettings

    rel = torch.arange(-1100, 1101)
    for buckets, max_relative in ((256, 512), (64, 256), (-1, 128)):
        rs = RelativeSettings(True, frozenset({"c2p", "p2c"}), buckets, max_relative, True, True)
        want = make_log_bucket_position(rel, buckets, max_relative).long() if buckets > 0 else rel
        assert torch.equal(rs.bucket(rel), want)
        for width in (1, 5, 129, 300, 513, 1100):
            reached = (rs.bucket(torch.arange(1 - width, width)) + rs.span).clamp(0, 2 * rs.span - 1)
            assert rs.rows(width) == (int(reached.min()), int(reached.max()) + 1)


def test_deberta_v2_conv_layer_is_refused(models_root, tmp_path):
    """deberta-v2-xlarge's ConvLayer (conv_kernel_size > 0) is not
    implemented: a load error naming it, not wrong logits."""
    import json
    import shutil

    from bench.harness.tiny_models import tiny_deberta_v2
    from rose.errors import ModelLoadError

    d = tmp_path / "deberta-conv"
    shutil.copytree(tiny_deberta_v2(models_root / "deberta-conv-src", seed=16), d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["conv_kernel_size"] = 3
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="conv_kernel_size"):
        Engine.from_dir(d, device="cpu")


def test_deberta_v2_on_static_buffers(models_root, texts):
    """The static-buffer path (bucketed width, filler segment) gives the
    eager scores on every pass (warm-up, capture, replay)."""
    from bench.harness.tiny_models import tiny_deberta_v2

    d = tiny_deberta_v2(models_root / "static-deberta", seed=17)
    seqs = tokenize(d, texts[:5])
    want = Engine.from_dir(d, device="cpu", dtype="float32").embed(seqs, kind="score")
    e = Engine.from_dir(d, device="cpu", dtype="float32", static_on_cpu=True)
    for _ in range(3):
        got = e.embed(seqs, kind="score")
        assert got.shape == want.shape and (got - want).abs().max() <= 1e-4
    assert e.runner.stats.steps["replay"] == 1
