"""BERT-family encoders (BERT, and XLM-RoBERTa through its position offset)
over a flat, unpadded token axis, and the sentence embedder built on them
(dense; BGE-M3's sparse and multi-vector heads where the directory has
them)."""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from ..attention import AttentionBackend
from ..config import ModelSpec
from ..errors import ModelLoadError
from ..interface import OutputKind
from ..loader import WeightReader
from .base import EmbeddingModel, StepInputs
from .heads import ColbertHead, SparseHead
from .layers import activation, copy_fused, copy_linear, copy_norm, segment_cumsum
from .sentence import SentenceHead


class BertLayer(nn.Module):
    # transformers' module names in a layer -> (this layer's linear, which
    # part of its output): where a LoRA adapter's matrices go (rose/adapters).
    peft_names: dict[str, tuple[str, int | None]] = {
        "attention.self.query": ("qkv", 0), "attention.self.key": ("qkv", 1), "attention.self.value": ("qkv", 2),
        "attention.output.dense": ("attn_out", None), "intermediate.dense": ("ffn_in", None),
        "output.dense": ("ffn_out", None)}

    def __init__(self, hidden: int, heads: int, ffn: int, eps: float, act, backend: AttentionBackend):
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        # Query, key and value as one matmul.
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.peft_parts = {"qkv": [hidden] * 3}
        self.attn_out = nn.Linear(hidden, hidden)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.ffn_in = nn.Linear(hidden, ffn)
        self.ffn_out = nn.Linear(ffn, hidden)
        self.ffn_norm = nn.LayerNorm(hidden, eps=eps)
        self.act = act
        self.backend = backend

    def forward(self, h: torch.Tensor, plan) -> torch.Tensor:
        t = h.shape[0]
        q, k, v = self.qkv(h).view(t, 3, self.heads, self.head_dim).unbind(1)
        a = self.backend.attend(q, k, v, plan, self.scale).reshape(t, -1)
        h = self.attn_norm(h + self.attn_out(a))
        return self.ffn_norm(h + self.ffn_out(self.act(self.ffn_in(h))))

    def load(self, w: WeightReader, p: str) -> None:
        att = f"{p}attention."
        with torch.no_grad():
            copy_fused(self.qkv, w, [f"{att}self.{n}" for n in ("query", "key", "value")])
            copy_linear(self.attn_out, w, f"{att}output.dense")
            copy_norm(self.attn_norm, w, f"{att}output.LayerNorm")
            copy_linear(self.ffn_in, w, f"{p}intermediate.dense")
            copy_linear(self.ffn_out, w, f"{p}output.dense")
            copy_norm(self.ffn_norm, w, f"{p}output.LayerNorm")


def padding_idx(spec: ModelSpec) -> int | None:
    """(XLM-)RoBERTa's padding index, which offsets its positions; None for
    BERT, whose positions start at 0."""
    if spec.model_type in ("xlm-roberta", "roberta"):
        return int(spec.hf_config.get("pad_token_id", 1))
    return None


class BertEncoder(nn.Module):
    """Embeddings + transformer layers over the flat token axis.

    With a ``padding_idx`` (XLM-RoBERTa), positions are counted as
    transformers does: padding_idx + 1 + the number of non-padding tokens
    so far in the sequence, and padding tokens sit at padding_idx."""

    def __init__(self, cfg: dict, backend: AttentionBackend, padding_idx: int | None = None):
        super().__init__()
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        if hidden % heads:
            raise ModelLoadError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ModelLoadError("only absolute position embeddings are supported for BERT-family models")
        eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.padding_idx = padding_idx
        self.word = nn.Embedding(int(cfg["vocab_size"]), hidden)
        self.position = nn.Embedding(int(cfg["max_position_embeddings"]), hidden)
        self.token_type = nn.Embedding(max(int(cfg.get("type_vocab_size", 1)), 1), hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        act = activation(str(cfg.get("hidden_act", "gelu")))
        self.layers = nn.ModuleList(
            BertLayer(hidden, heads, int(cfg["intermediate_size"]), eps, act, backend)
            for _ in range(int(cfg["num_hidden_layers"]))
        )

    def forward(self, x: StepInputs, token_types: torch.Tensor | None = None) -> torch.Tensor:
        h = self.word(x.token_ids) + self.position(self.position_ids(x))
        if token_types is None:
            h = h + self.token_type.weight[0]
        else:
            h = h + self.token_type(token_types)
        h = self.norm(h)
        for layer in self.layers:
            h = layer(h, x.plan)
        return h

    def position_ids(self, x: StepInputs) -> torch.Tensor:
        """Rows of the position table. Real tokens stay in range (the engine
        checks lengths); a graph bucket's filler segment, whose rows are
        discarded, is clamped into the table."""
        if self.padding_idx is None:
            pos = x.positions.long()
        else:
            real = (x.token_ids != self.padding_idx).long()
            pos = segment_cumsum(real, x.cu_seqlens, x.seg_ids) * real + self.padding_idx
        return pos.clamp_max(self.position.num_embeddings - 1)

    def load(self, w: WeightReader) -> None:
        with torch.no_grad():
            self.word.weight.copy_(w.take("embeddings.word_embeddings.weight"))
            self.position.weight.copy_(w.take("embeddings.position_embeddings.weight"))
            self.token_type.weight.copy_(w.take("embeddings.token_type_embeddings.weight"))
            copy_norm(self.norm, w, "embeddings.LayerNorm")
        for i, layer in enumerate(cast("list[BertLayer]", self.layers)):  # ModuleList yields nn.Module
            layer.load(w, f"encoder.layer.{i}.")


class BertEmbedder(EmbeddingModel):
    """A BERT or XLM-RoBERTa sentence embedder: dense (CLS or mean, as the
    sentence-transformers config says), plus BGE-M3's sparse and
    multi-vector heads when their files are in the directory."""

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__()
        self.encoder = BertEncoder(spec.hf_config, backend, padding_idx(spec))
        assert spec.pipeline is not None  # an embedder's spec always has one (config._pipeline)
        self.sentence = SentenceHead(spec.pipeline, spec.hidden_size)
        self.dimension = self.sentence.dimension
        self.kinds = tuple(spec.kinds())
        self.spec = spec
        self.sparse = SparseHead(spec.hidden_size, spec.vocab_size, spec.special_token_ids()) \
            if spec.sparse_head else None
        self.colbert = ColbertHead.from_file(spec.colbert_head) if spec.colbert_head else None
        if self.colbert is not None:
            self.multi_vector_dimension = self.colbert.dimension

    def encode(self, x: StepInputs) -> torch.Tensor:
        return self.encoder(x)

    def adapter_layers(self) -> list[nn.Module]:
        return list(self.encoder.layers)

    def head(self, kind: OutputKind, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        if kind is OutputKind.SPARSE and self.sparse is not None:
            return self.sparse(hidden, x.token_ids)
        if kind is OutputKind.MULTI_VECTOR and self.colbert is not None:
            return self.colbert(hidden, x)
        return super().head(kind, hidden, x)

    def load(self, w: WeightReader) -> None:
        self.encoder.load(w)
        self.sentence.load_files()
        # Each head is built only when its file is there (ModelSpec.sparse_head, .colbert_head).
        if self.sparse is not None:
            sparse = self.spec.sparse_head
            assert sparse is not None
            self.sparse.load_file(sparse)
        if self.colbert is not None:
            colbert = self.spec.colbert_head
            assert colbert is not None
            self.colbert.load_file(colbert)
