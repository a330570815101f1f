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

from tests.fixtures import TOKENIZERS, tokenizer_dir


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """Seeded weights that make every part matter: matrices at std
    1/sqrt(fan_in) (transformers' 0.02 leaves attention nearly uniform and
    residuals dominant, which would hide attention bugs), and noise on
    norms and biases (initialised to 1 and 0, which would hide loading
    mistakes)."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 1:
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


def tiny_xlmr(dir, seed: int = 0, pooling: str = "cls", m3_heads: bool = True) -> Path:
    """A 2-layer XLM-RoBERTa embedder in BGE-M3's layout (hidden 32, 4
    heads of 8; 8194 positions, so 8192 tokens) with the XLM-R tokenizer;
    normalised dense output (``pooling`` "cls" as bge-m3, "mean" as
    multilingual-e5). With ``m3_heads``, also ``sparse_linear.pt``
    (Linear(hidden, 1)) and ``colbert_linear.pt`` (Linear(hidden, hidden))."""
    from transformers import XLMRobertaConfig, XLMRobertaModel

    out = _dir(dir)
    torch.manual_seed(seed)
    cfg = XLMRobertaConfig(vocab_size=250002, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                           intermediate_size=64, max_position_embeddings=8194, type_vocab_size=1,
                           pad_token_id=1, bos_token_id=0, eos_token_id=2)
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


def tiny_reranker(dir, seed: int = 0, arch: str = "xlm-roberta") -> Path:
    """A 2-layer cross-encoder with one label: ``arch`` "xlm-roberta"
    (bge-reranker-v2-m3 style, XLM-R tokenizer, 512 tokens) or "bert"
    (ms-marco MiniLM style, WordPiece tokenizer with token types, 512)."""
    from transformers import BertConfig, BertForSequenceClassification, XLMRobertaConfig, \
        XLMRobertaForSequenceClassification

    out = _dir(dir)
    torch.manual_seed(seed)
    if arch == "xlm-roberta":
        cfg = XLMRobertaConfig(vocab_size=250002, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               intermediate_size=64, max_position_embeddings=514, type_vocab_size=1,
                               pad_token_id=1, bos_token_id=0, eos_token_id=2, num_labels=1)
        _save(XLMRobertaForSequenceClassification(cfg), out, seed)
        _tokenizer(out, "xlm-roberta", model_max_length=512)
    elif arch == "bert":
        cfg = BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=128, max_position_embeddings=512, type_vocab_size=2, num_labels=1)
        _save(BertForSequenceClassification(cfg), out, seed)
        _tokenizer(out, "all-minilm-l6-v2", model_max_length=512)
    else:
        raise ValueError(f"arch {arch!r} is not one of xlm-roberta, bert")
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
