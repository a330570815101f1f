"""Builders of tiny random-weight Hugging Face model directories, one per
architecture ROSE serves, for tests and benchmarks.

Each writes a complete directory (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, and sentence-transformers files where
the real models have them) from ``transformers`` config classes with seeded
weights. Every parameter, norms and biases included, gets seeded noise, so
a weight loaded into the wrong place changes the outputs. Real tokenizers
come from ``tests/data/tokenizers``; vocabularies are the real ones, hidden
sizes are small (2-4 layers) so the models run fast on two CPU cores.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch

from bench.harness.fixtures import TOKENIZERS, tokenizer_dir


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Seeded weights that make every part matter: matrices at std
    1/sqrt(fan_in) (transformers' 0.02 leaves attention nearly uniform and
    residuals dominant, which would hide attention bugs), and noise on
    norms and biases (initialised to 1 and 0, which would hide loading
    mistakes)."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() <= 1:  # vectors, and scalars (CLIP's logit scale)
                p.add_(torch.randn(p.shape, generator=g) * 0.1)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)


def _save(model, out: Path, seed: int) -> None:
    _perturb(model, seed)
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)


def _write_json(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")


def _tokenizer(out: Path, name: str, post_processor: dict | None = None, **config) -> None:
    """Copies a real tokenizer without fixed padding/truncation and writes
    its tokenizer_config.json (with the given fields)."""
    tok = json.loads((tokenizer_dir(name) / "tokenizer.json").read_text(encoding="utf-8"))
    tok["padding"] = None
    tok["truncation"] = None
    if post_processor is not None:
        tok["post_processor"] = post_processor
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    src_cfg = TOKENIZERS / name / "tokenizer_config.json"
    cfg = json.loads(src_cfg.read_text(encoding="utf-8")) if src_cfg.is_file() else {}
    for k in ("is_local", "local_files_only"):
        cfg.pop(k, None)
    cfg.update(config)
    _write_json(out / "tokenizer_config.json", cfg)
    for extra in ("vocab.txt", "sentencepiece.bpe.model"):
        if (TOKENIZERS / name / extra).is_file():
            shutil.copy(TOKENIZERS / name / extra, out / extra)


def _sentence_transformers(out: Path, pooling: str, normalize: bool, max_seq_length: int) -> None:
    """modules.json + Pooling (+ Normalize) + sentence_bert_config.json."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out / "2_Normalize").mkdir(parents=True, exist_ok=True)
    _write_json(out / "modules.json", modules)
    hidden = json.loads((out / "config.json").read_text())["hidden_size"]
    modes = {"cls": "pooling_mode_cls_token", "mean": "pooling_mode_mean_tokens", "last": "pooling_mode_lasttoken"}
    pool_cfg = {"word_embedding_dimension": hidden, **{m: (pooling == k) for k, m in modes.items()}}
    _write_json(out / "1_Pooling" / "config.json", pool_cfg)
    _write_json(out / "sentence_bert_config.json", {"max_seq_length": max_seq_length, "do_lower_case": False})


def _dir(path) -> Path:
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    return out


def tiny_bert(dir, seed: int = 0, pooling: str = "mean") -> Path:
    """A 2-layer BERT sentence embedder (hidden 64, 4 heads of 16) with the
    all-MiniLM-L6-v2 WordPiece tokenizer; ``pooling`` "mean" or "cls";
    normalised; max length 256."""
    from transformers import BertConfig, BertModel

    out = _dir(dir)
    torch.manual_seed(seed)
    cfg = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=512, type_vocab_size=2)
    _save(BertModel(cfg, add_pooling_layer=False), out, seed)
    _tokenizer(out, "all-minilm-l6-v2", model_max_length=512)
    _sentence_transformers(out, pooling, normalize=True, max_seq_length=256)
    return out


def _xlmr_config(**shape):
    """An ``XLMRobertaConfig`` with XLM-R's vocabulary and special ids
    (pad 1, bos 0, eos 2, one token type) and the given sizes."""
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(vocab_size=250002, type_vocab_size=1, pad_token_id=1, bos_token_id=0, eos_token_id=2,
                            **shape)


def tiny_xlmr(dir, seed: int = 0, pooling: str = "cls", m3_heads: bool = True) -> Path:
    """A 2-layer XLM-RoBERTa embedder in BGE-M3's layout (hidden 32, 4
    heads of 8; 8194 positions, so 8192 tokens) with the XLM-R tokenizer;
    normalised dense output (``pooling`` "cls" as bge-m3, "mean" as
    multilingual-e5). With ``m3_heads``, also ``sparse_linear.pt``
    (Linear(hidden, 1)) and ``colbert_linear.pt`` (Linear(hidden, hidden))."""
    from transformers import XLMRobertaModel

    out = _dir(dir)
    torch.manual_seed(seed)
    cfg = _xlmr_config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                       max_position_embeddings=8194)
    _save(XLMRobertaModel(cfg, add_pooling_layer=False), out, seed)
    _tokenizer(out, "xlm-roberta", model_max_length=8192)
    _sentence_transformers(out, pooling, normalize=True, max_seq_length=8192)
    if m3_heads:
        g = torch.Generator().manual_seed(seed + 2)
        for name, width in (("sparse_linear.pt", 1), ("colbert_linear.pt", cfg.hidden_size)):
            state = {"weight": torch.randn(width, cfg.hidden_size, generator=g) * 0.3,
                     "bias": torch.randn(width, generator=g) * 0.1}
            torch.save(state, out / name)
    return out


def multilingual_minilm(dir, seed: int = 0) -> Path:
    """A random-weight XLM-RoBERTa embedder at full size in
    paraphrase-multilingual-MiniLM-L12-v2's shape (12 layers, hidden 384,
    12 heads, FFN 1536, the 250k XLM-R vocabulary; mean pooling, 128
    tokens, not normalised): the XLM-R family's CPU benchmark model."""
    from transformers import XLMRobertaModel

    out = _dir(dir)
    torch.manual_seed(seed)
    cfg = _xlmr_config(hidden_size=384, num_hidden_layers=12, num_attention_heads=12, intermediate_size=1536,
                       max_position_embeddings=514)
    _save(XLMRobertaModel(cfg, add_pooling_layer=False), out, seed)
    _tokenizer(out, "xlm-roberta", model_max_length=512)
    _sentence_transformers(out, "mean", normalize=False, max_seq_length=128)
    return out


def tiny_reranker(dir, seed: int = 0, arch: str = "xlm-roberta", labels: tuple[str, ...] = ()) -> Path:
    """A 2-layer cross-encoder with one label: ``arch`` "xlm-roberta"
    (bge-reranker-v2-m3 style, XLM-R tokenizer, 512 tokens) or "bert"
    (ms-marco MiniLM style, WordPiece tokenizer with token types, 512).
    With ``labels``, a sequence classifier with those ``id2label`` names."""
    names = {"num_labels": 1} if not labels else {
        "id2label": dict(enumerate(labels)), "label2id": {n: i for i, n in enumerate(labels)}}
    from transformers import BertConfig, BertForSequenceClassification, XLMRobertaForSequenceClassification

    out = _dir(dir)
    torch.manual_seed(seed)
    if arch == "xlm-roberta":
        cfg = _xlmr_config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=514, **names)
        _save(XLMRobertaForSequenceClassification(cfg), out, seed)
        _tokenizer(out, "xlm-roberta", model_max_length=512)
    elif arch == "bert":
        cfg = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, max_position_embeddings=512, type_vocab_size=2, **names)
        _save(BertForSequenceClassification(cfg), out, seed)
        _tokenizer(out, "all-minilm-l6-v2", model_max_length=512)
    else:
        raise ValueError(f"arch {arch!r} is not one of xlm-roberta, bert")
    return out


def tiny_deberta_v2(dir, seed: int = 0, labels: tuple[str, ...] = ("score",), **overrides) -> Path:
    """A ``DebertaV2ForSequenceClassification`` with microsoft/deberta-v3-base's
    relative-attention settings (position_buckets 256, max_relative_positions
    -1, so 512 from max_position_embeddings; pos_att_type "p2c|c2p" written
    as the Hub's config.json writes it; share_att_key; norm_rel_ebd
    layer_norm; no absolute positions; no token types; GELU pooler) cut to 2
    layers of hidden 64 with 4 heads. One label (the default) is a
    mxbai-rerank / ms-marco style cross-encoder; several, a classifier with
    those ``id2label`` names. ``overrides`` replace config fields (e.g.
    ``share_att_key=False``).

    DeBERTa-v3's own tokenizer is SentencePiece; random weights only need
    ids below vocab_size, so this uses all-MiniLM-L6-v2's WordPiece
    tokenizer ([CLS] A [SEP] B [SEP], [PAD] = 0 as DeBERTa's pad_token_id)
    with vocab_size 30522 to match it."""
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification

    out = _dir(dir)
    torch.manual_seed(seed)
    settings = dict(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, hidden_act="gelu", max_position_embeddings=512, type_vocab_size=0,
                    layer_norm_eps=1e-7, relative_attention=True, position_buckets=256, max_relative_positions=-1,
                    pos_att_type="p2c|c2p", share_att_key=True, norm_rel_ebd="layer_norm",
                    position_biased_input=False, pooler_hidden_act="gelu", pad_token_id=0,
                    id2label=dict(enumerate(labels)), label2id={n: i for i, n in enumerate(labels)})
    settings.update(overrides)
    _save(DebertaV2ForSequenceClassification(DebertaV2Config(**settings)), out, seed)
    config = json.loads((out / "config.json").read_text())
    if isinstance(settings["pos_att_type"], str):
        config["pos_att_type"] = settings["pos_att_type"]
    _write_json(out / "config.json", config)
    _tokenizer(out, "all-minilm-l6-v2", model_max_length=512)
    return out


# Qwen3-Embedding's tokenizer appends <|endoftext|> (the token it pools).
_QWEN3_APPEND_EOS = {
    "type": "Sequence",
    "processors": [
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        {"type": "TemplateProcessing",
         "single": [{"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
         "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}},
                  {"SpecialToken": {"id": "<|endoftext|>", "type_id": 1}}],
         "special_tokens": {"<|endoftext|>": {"id": "<|endoftext|>", "ids": [151643], "tokens": ["<|endoftext|>"]}}},
    ],
}


def tiny_qwen3(dir, seed: int = 0, variant: str = "causal") -> Path:
    """A 2-layer Qwen3 embedder with GQA (4 query heads, 2 KV heads) and
    head dim 128 (hidden 64), the Qwen3 tokenizer, 32768 positions.

    ``variant="causal"``: Qwen3-Embedding style: causal attention,
    last-token pooling, normalised; the tokenizer appends <|endoftext|>.
    ``variant="pplx"``: pplx-embed-v1 style: ``use_bidirectional_attention``
    and ``embedding_quantization: tanh_int8`` in config.json, mean pooling,
    not normalised."""
    from transformers import Qwen3Config, Qwen3Model

    if variant not in ("causal", "pplx"):
        raise ValueError(f"variant {variant!r} is not one of causal, pplx")
    out = _dir(dir)
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=151669, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=128, max_position_embeddings=32768,
                      rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"}, rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643)
    _save(Qwen3Model(cfg), out, seed)
    if variant == "pplx":
        config = json.loads((out / "config.json").read_text())
        config.update(use_bidirectional_attention=True, embedding_quantization="tanh_int8")
        _write_json(out / "config.json", config)
    _tokenizer(out, "qwen3", post_processor=_QWEN3_APPEND_EOS if variant == "causal" else None,
               tokenizer_class="Qwen2Tokenizer", eos_token="<|endoftext|>", pad_token="<|endoftext|>",
               model_max_length=32768)
    _sentence_transformers(out, "last" if variant == "causal" else "mean", normalize=variant == "causal",
                           max_seq_length=32768)
    return out


def st_pipeline(dir, base: Path, pooling="mean", max_seq_length: int = 256, dense: tuple[tuple[int, str], ...] = ((48, "Tanh"),),
                normalize: bool = True, seed: int = 0, prompts: dict[str, str] | None = None,
                default_prompt_name: str | None = None, safe: bool = True, bias: bool = True) -> Path:
    """A sentence-transformers model saved by sentence-transformers itself:
    Transformer (the model in ``base``) + Pooling (``pooling``: one mode or
    a tuple of modes) + a Dense per ``(out_features, activation class in
    torch.nn)`` with seeded weights (``bias`` or not) + Normalize.
    ``safe=False`` saves the Dense weights as pytorch_model.bin."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Dense, Normalize, Pooling, Transformer

    out = _dir(dir)
    transformer = Transformer(str(base), max_seq_length=max_seq_length)
    dim = transformer.get_embedding_dimension()
    modules = [transformer, Pooling(dim, pooling_mode=pooling)]
    width = modules[1].get_embedding_dimension()
    g = torch.Generator().manual_seed(seed + 7)
    for features, act in dense:
        layer = Dense(width, features, bias=bias, activation_function=getattr(torch.nn, act)())
        with torch.no_grad():
            layer.linear.weight.copy_(torch.randn(features, width, generator=g) * width ** -0.5)
            if bias:
                layer.linear.bias.copy_(torch.randn(features, generator=g) * 0.1)
        modules.append(layer)
        width = features
    if normalize:
        modules.append(Normalize())
    st = SentenceTransformer(modules=modules, device="cpu", prompts=prompts, default_prompt_name=default_prompt_name)
    st.save(str(out), safe_serialization=safe)
    return out


def tiny_mpnet(dir, seed: int = 0) -> Path:
    """An all-mpnet-base-v2-shaped MPNet (hidden 768, 12 heads, FFN 3072,
    vocabulary 30527, 514 positions, 32 relative-position buckets) cut to 2
    layers, with the WordPiece tokenizer of all-MiniLM-L6-v2 (ids fit the
    vocabulary); mean pooling, normalised, max length 384, as the real
    sentence-transformers model."""
    from transformers import MPNetConfig, MPNetModel

    out = _dir(dir)
    torch.manual_seed(seed)
    cfg = MPNetConfig(vocab_size=30527, hidden_size=768, num_hidden_layers=2, num_attention_heads=12,
                      intermediate_size=3072, max_position_embeddings=514, relative_attention_num_buckets=32,
                      pad_token_id=1, bos_token_id=0, eos_token_id=2, layer_norm_eps=1e-5)
    _save(MPNetModel(cfg, add_pooling_layer=False), out, seed)
    _tokenizer(out, "all-minilm-l6-v2", model_max_length=512)
    _sentence_transformers(out, "mean", normalize=True, max_seq_length=384)
    return out


def tiny_modernbert(dir, seed: int = 0, local_attention: int = 128, labels: tuple[str, ...] | None = None,
                    classifier_pooling: str = "cls") -> Path:
    """A gte-modernbert-base-shaped ModernBERT (hidden 768, 12 heads, GeGLU
    FFN 1152, vocabulary 50368, 8192 positions, RoPE bases 160000 global /
    10000 local, a global layer every 3) cut to 3 layers (one global, two
    local), with the WordPiece tokenizer of all-MiniLM-L6-v2 (ids fit the
    vocabulary); CLS pooling, normalised, max length 8192. With ``labels``,
    a ``ModernBertForSequenceClassification`` instead (gte-reranker-modernbert
    style with one label), pooling its classifier input by
    ``classifier_pooling``."""
    from transformers import ModernBertConfig, ModernBertForSequenceClassification, ModernBertModel

    out = _dir(dir)
    torch.manual_seed(seed)
    cfg = ModernBertConfig(vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=3,
                           num_attention_heads=12, max_position_embeddings=8192, local_attention=local_attention,
                           global_attn_every_n_layers=3, pad_token_id=50283, bos_token_id=50281,
                           eos_token_id=50282, cls_token_id=50281, sep_token_id=50282,
                           classifier_pooling=classifier_pooling,
                           **({} if labels is None else {"id2label": dict(enumerate(labels))}))
    if labels is not None:
        _save(ModernBertForSequenceClassification(cfg), out, seed)
        _tokenizer(out, "all-minilm-l6-v2", model_max_length=8192)
        return out
    _save(ModernBertModel(cfg), out, seed)
    _tokenizer(out, "all-minilm-l6-v2", model_max_length=8192)
    _sentence_transformers(out, "cls", normalize=True, max_seq_length=8192)
    return out


def tiny_splade(dir, seed: int = 0, arch: str = "bert", strategy: str = "max") -> Path:
    """A SPLADE sparse encoder saved by sentence-transformers itself (its
    Transformer with transformer_task="fill-mask" + SpladePooling) on a
    2-layer masked LM: ``arch`` "bert" (splade-v3 / splade-cocondenser
    style, WordPiece vocabulary 30522, tied decoder) or "xlm-roberta"
    (multilingual, XLM-R vocabulary)."""
    from sentence_transformers import SparseEncoder
    from sentence_transformers.base.modules import Transformer
    from sentence_transformers.sparse_encoder.modules import SpladePooling
    from transformers import BertConfig, BertForMaskedLM, XLMRobertaForMaskedLM

    out = _dir(dir)
    mlm = out / "mlm"
    torch.manual_seed(seed)
    if arch == "bert":
        cfg = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, max_position_embeddings=512, type_vocab_size=2)
        _save(BertForMaskedLM(cfg), mlm, seed)
        _tokenizer(mlm, "all-minilm-l6-v2", model_max_length=512)
    elif arch == "xlm-roberta":
        cfg = _xlmr_config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                           max_position_embeddings=514)
        _save(XLMRobertaForMaskedLM(cfg), mlm, seed)
        _tokenizer(mlm, "xlm-roberta", model_max_length=512)
    else:
        raise ValueError(f"arch {arch!r} is not one of bert, xlm-roberta")
    transformer = Transformer(str(mlm), transformer_task="fill-mask", max_seq_length=256)
    SparseEncoder(modules=[transformer, SpladePooling(strategy)], device="cpu").save(str(out / "st"))
    return out / "st"


def tiny_qwen3_reranker(dir, seed: int = 0, tied: bool = True, st_files: bool = False) -> Path:
    """A Qwen3-Reranker-0.6B-shaped causal LM (16 query heads, 8 KV heads,
    head dim 128, the Qwen3 vocabulary and tokenizer, 40960 positions) cut
    to hidden 128 and 2 layers; ``tied`` LM head as the 0.6B. With
    ``st_files``, saved as sentence-transformers' CrossEncoder saves it
    (Transformer + LogitScore); else config and weights only, as on the Hub."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    out = _dir(dir)
    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=151669, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                      rope_parameters={"rope_theta": 1000000.0, "rope_type": "default"}, rms_norm_eps=1e-6,
                      tie_word_embeddings=tied, bos_token_id=151643, eos_token_id=151645)
    _save(Qwen3ForCausalLM(cfg), out, seed)
    _tokenizer(out, "qwen3", tokenizer_class="Qwen2Tokenizer", eos_token="<|im_end|>", pad_token="<|endoftext|>",
               model_max_length=8192)
    if st_files:
        from sentence_transformers import CrossEncoder

        st_dir = out.parent / (out.name + "-st")
        CrossEncoder(str(out), device="cpu").save(str(st_dir))
        return st_dir
    return out


def tiny_embeddinggemma(dir, seed: int = 0, sliding_window: int = 512) -> Path:
    """An EmbeddingGemma-300m-shaped encoder (hidden 768, 3 query heads, 1
    KV head, head dim 256, GeGLU FFN 1152, query_pre_attn_scalar 256,
    bidirectional, RoPE 1e6 global / 1e4 local) cut to 2 layers (one
    sliding, one global) and, to stay small, the WordPiece vocabulary and
    tokenizer of all-MiniLM-L6-v2; its sentence-transformers pipeline as
    the real model's: mean pooling, Dense 768→3072→768 (no bias,
    identity), Normalize, and its prompts."""
    from transformers import Gemma3TextConfig, Gemma3TextModel

    out = _dir(dir)
    base = out / "hf"
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=30522, hidden_size=768, intermediate_size=1152, num_hidden_layers=2,
                           num_attention_heads=3, num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256,
                           max_position_embeddings=2048, sliding_window=sliding_window,
                           layer_types=["sliding_attention", "full_attention"], use_bidirectional_attention=True,
                           rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
                           pad_token_id=0, bos_token_id=101, eos_token_id=102)
    _save(Gemma3TextModel(cfg), base, seed)
    _tokenizer(base, "all-minilm-l6-v2", model_max_length=2048)
    prompts = {"query": "task: search result | query: ", "document": "title: none | text: "}
    return st_pipeline(out / "st", base, pooling="mean", dense=((3072, "Identity"), (768, "Identity")),
                       normalize=True, seed=seed, prompts=prompts, bias=False)


def tiny_nomic_bert(dir, seed: int = 0) -> Path:
    """A nomic-embed-text-v1.5-shaped NomicBERT in transformers' layout
    (hidden 768, 12 heads, SwiGLU FFN 3072, vocabulary 30528, RoPE base
    1000, 2048 positions) cut to 2 layers, with the all-MiniLM-L6-v2
    WordPiece tokenizer (the same BERT vocabulary); mean pooling,
    normalised, with nomic's task prefixes as prompts."""
    from transformers import NomicBertConfig, NomicBertModel

    out = _dir(dir)
    base = out / "hf"
    torch.manual_seed(seed)
    cfg = NomicBertConfig(vocab_size=30528, hidden_size=768, num_hidden_layers=2, num_attention_heads=12,
                          intermediate_size=3072, max_position_embeddings=2048, type_vocab_size=2,
                          rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    _save(NomicBertModel(cfg), base, seed)
    _tokenizer(base, "all-minilm-l6-v2", model_max_length=2048)
    prompts = {"query": "search_query: ", "document": "search_document: "}
    return st_pipeline(out / "st", base, pooling="mean", dense=(), normalize=True, prompts=prompts,
                       max_seq_length=2048)



def tiny_dual_encoder(dir, seed: int = 0, family: str = "clip", eos_token_id: int = 999,
                      served: bool = False) -> Path:
    """A 2-layer CLIP (``family="clip"``) or SigLIP (``"siglip"``) model
    (``CLIPModel`` / ``SiglipModel``) with towers of different widths so a
    mixed-up weight cannot load: text hidden 32 (4 heads), vocabulary 1000,
    16 positions; vision hidden 48 (4 heads of 12). CLIP: 32-pixel images
    in 8-pixel patches, projection 24, ``eos_token_id`` as given (2 is the
    legacy "largest id" pooling). SigLIP: 48-pixel images in 16-pixel
    patches, the text head projecting to 48. No tokenizer (none is stored
    for these vocabularies): tests give token ids.

    ``served``: a directory a server starts, as on the Hub: the
    all-MiniLM-L6-v2 WordPiece tokenizer (vocabulary 30522; [CLS] 101 and
    [SEP] 102 as start and end of text, pad 0; SigLIP pads to its 16
    positions) and transformers' own ``preprocessor_config.json`` (CLIP:
    shortest edge 32, centre crop 32, bicubic; SigLIP: 48x48 bilinear)."""
    from transformers import CLIPConfig, CLIPModel, SiglipConfig, SiglipModel

    out = _dir(dir)
    torch.manual_seed(seed)
    text = dict(vocab_size=30522 if served else 1000, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=4, max_position_embeddings=16)
    if served:
        bos, eos_token_id, pad = 101, 102, 0
    else:
        bos, pad = 998, 1
    vision = dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4)
    if family == "clip":
        cfg = CLIPConfig(text_config={**text, "bos_token_id": bos, "eos_token_id": eos_token_id, "pad_token_id": pad},
                         vision_config={**vision, "image_size": 32, "patch_size": 8}, projection_dim=24)
        _save(CLIPModel(cfg), out, seed)
    elif family == "siglip":
        cfg = SiglipConfig(text_config={**text, "projection_size": 48, "bos_token_id": None,
                                        "eos_token_id": eos_token_id, "pad_token_id": pad},
                           vision_config={**vision, "image_size": 48, "patch_size": 16})
        _save(SiglipModel(cfg), out, seed)
    else:
        raise ValueError(f"family {family!r} is not one of clip, siglip")
    if served:
        from transformers import CLIPImageProcessor, SiglipImageProcessor

        _tokenizer(out, "all-minilm-l6-v2", model_max_length=16)
        if family == "clip":
            CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}).save_pretrained(out)
        else:
            SiglipImageProcessor(size={"height": 48, "width": 48}).save_pretrained(out)
    return out
