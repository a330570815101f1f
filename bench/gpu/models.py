"""Random-weight models of the benchmark shapes, built on the device with
``transformers`` config classes (seeded) and saved as Hugging Face
directories ROSE loads; the in-memory ``transformers`` model is the
reference for the correctness gate and the eager baseline for timing."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import torch


@dataclass(frozen=True)
class Shape:
    name: str
    arch: str  # "bert" | "xlm-roberta" | "qwen3"
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    max_length: int
    pooling: str  # "cls" | "mean"
    normalize: bool
    tokenizer: str  # folder in tests/data/tokenizers
    pplx: bool = False  # bidirectional, mean, round(127 * tanh(x))


SHAPES = {
    # BGE-M3 = XLM-RoBERTa large.
    "bge-m3": Shape("bge-m3", "xlm-roberta", 24, 1024, 16, 16, 64, 4096, 250002, 8192, "cls", True, "xlm-roberta"),
    # pplx-embed-1-0.6b ≈ Qwen3-0.6B, bidirectional, mean pooling, tanh → int8 range.
    "pplx-0.6b": Shape("pplx-0.6b", "qwen3", 28, 1024, 16, 8, 128, 3072, 151936, 32768, "mean", False, "qwen3",
                       pplx=True),
    # all-MiniLM-L6-v2's shape: the BERT path of the gate.
    "minilm": Shape("minilm", "bert", 6, 384, 12, 12, 32, 1536, 30522, 512, "mean", True, "all-minilm-l6-v2"),
}


def tiny(shape: Shape) -> Shape:
    """The same architecture at a size that runs in seconds on two CPU cores."""
    return replace(shape, layers=2, hidden=64, heads=4, kv_heads=2 if shape.arch == "qwen3" else 4,
                   head_dim=16, ffn=128, max_length=min(shape.max_length, 512))


def _config(s: Shape):
    if s.arch == "bert":
        from transformers import BertConfig

        return BertConfig(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                          num_attention_heads=s.heads, intermediate_size=s.ffn, max_position_embeddings=s.max_length,
                          type_vocab_size=2)
    if s.arch == "xlm-roberta":
        from transformers import XLMRobertaConfig

        return XLMRobertaConfig(vocab_size=s.vocab, hidden_size=s.hidden, num_hidden_layers=s.layers,
                                num_attention_heads=s.heads, intermediate_size=s.ffn,
                                max_position_embeddings=s.max_length + 2, type_vocab_size=1,
                                pad_token_id=1, bos_token_id=0, eos_token_id=2)
    from transformers import Qwen3Config

    return Qwen3Config(vocab_size=s.vocab, hidden_size=s.hidden, intermediate_size=s.ffn,
                       num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
                       head_dim=s.head_dim, max_position_embeddings=s.max_length, rms_norm_eps=1e-6,
                       tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151643)


def _model_class(arch: str):
    import transformers

    return {"bert": transformers.BertModel, "xlm-roberta": transformers.XLMRobertaModel,
            "qwen3": transformers.Qwen3Model}[arch]


def build(shape: Shape, out: Path, device: str, seed: int = 0):
    """Builds, seeds and saves the model; returns the ``transformers`` model
    (fp32, on ``device``, eval mode) with the same weights."""
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    cls = _model_class(shape.arch)
    kw = {} if shape.arch == "qwen3" else {"add_pooling_layer": False}
    with torch.device(device):
        model = cls(_config(shape), **kw)
        # Norms and biases start at 1 and 0; noise makes a weight loaded
        # into the wrong place visible to the gate.
        g = torch.Generator(device=device).manual_seed(seed + 1)
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() == 1:
                    p.add_(torch.randn(p.shape, generator=g, device=device) * 0.1)
    model.eval()
    model.save_pretrained(str(out), safe_serialization=True)
    if shape.pplx:
        cfg = json.loads((out / "config.json").read_text())
        cfg.update(use_bidirectional_attention=True, embedding_quantization="tanh_int8")
        (out / "config.json").write_text(json.dumps(cfg, indent=1))
    _sentence_transformers_files(shape, out)
    _tokenizer_files(shape, out)
    return model


def _write(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1))


def _sentence_transformers_files(s: Shape, out: Path) -> None:
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if s.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (out / "2_Normalize").mkdir(exist_ok=True)
    _write(out / "modules.json", modules)
    _write(out / "1_Pooling" / "config.json",
           {"word_embedding_dimension": s.hidden, "pooling_mode_cls_token": s.pooling == "cls",
            "pooling_mode_mean_tokens": s.pooling == "mean", "pooling_mode_lasttoken": False})
    _write(out / "sentence_bert_config.json", {"max_seq_length": s.max_length, "do_lower_case": False})


def _tokenizer_files(s: Shape, out: Path) -> None:
    from bench.harness.fixtures import tokenizer_dir

    tok = json.loads((tokenizer_dir(s.tokenizer) / "tokenizer.json").read_text(encoding="utf-8"))
    tok["padding"] = None
    tok["truncation"] = None
    (out / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False), encoding="utf-8")
    _write(out / "tokenizer_config.json", {"model_max_length": s.max_length})


def token_ids(shape: Shape, n: int, seed: int) -> list[int]:
    """``n`` token ids: random body ids between the model's special tokens."""
    g = torch.Generator().manual_seed(seed)
    body = torch.randint(1000, min(shape.vocab, 30000), (max(n - 2, 0),), generator=g).tolist()
    if shape.arch == "qwen3":
        return torch.randint(1000, 30000, (n,), generator=g).tolist()
    first, last = (101, 102) if shape.arch == "bert" else (0, 2)
    return [first, *body, last][:n]


@torch.inference_mode()
def reference(model, shape: Shape, sequences: list[list[int]]) -> torch.Tensor:
    """The model's embedding per sequence with ``transformers`` (one sequence
    per forward, so no padding is involved), in float32 on the host."""
    device = next(model.parameters()).device
    out = []
    for seq in sequences:
        ids = torch.tensor([seq], device=device)
        out.append(pool(forward(model, shape, ids), shape)[0])
    return torch.stack(out).float().cpu()


def forward(model, shape: Shape, ids: torch.Tensor) -> torch.Tensor:
    """Last hidden states for equal-length rows; bidirectional for pplx (a
    full mask handed to every layer)."""
    if shape.pplx:
        n, t = ids.shape
        full = torch.zeros(n, 1, t, t, dtype=next(model.parameters()).dtype, device=ids.device)
        return model(input_ids=ids, attention_mask={"full_attention": full}).last_hidden_state
    return model(input_ids=ids).last_hidden_state


def pool(hidden: torch.Tensor, shape: Shape) -> torch.Tensor:
    x = hidden[:, 0] if shape.pooling == "cls" else hidden.mean(dim=1)
    x = x.float()
    if shape.pplx:
        return torch.round(127 * torch.tanh(x))
    return torch.nn.functional.normalize(x, dim=-1) if shape.normalize else x


def remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)
