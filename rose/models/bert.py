"""BERT-family encoders (BERT, and XLM-RoBERTa through its position offset)
over a flat, unpadded token axis."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import AttentionBackend, AttnShape
from ..config import ModelSpec
from ..errors import ModelLoadError
from ..loader import WeightReader
from .base import EmbeddingModel, StepInputs

_ACTIVATIONS = {
    "gelu": lambda x: F.gelu(x),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}


def activation(name: str):
    try:
        return _ACTIVATIONS[name]
    except KeyError:
        raise ModelLoadError(f"activation {name!r} is not supported") from None


class BertLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, ffn: int, eps: float, act, backend: AttentionBackend):
        super().__init__()
        self.heads = heads
        self.head_dim = hidden // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        # Query, key and value as one matmul.
        self.qkv = nn.Linear(hidden, 3 * hidden)
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
            self.qkv.weight.copy_(torch.cat([w.take(f"{att}self.{n}.weight") for n in ("query", "key", "value")]))
            self.qkv.bias.copy_(torch.cat([w.take(f"{att}self.{n}.bias") for n in ("query", "key", "value")]))
            _copy_linear(self.attn_out, w, f"{att}output.dense")
            _copy_norm(self.attn_norm, w, f"{att}output.LayerNorm")
            _copy_linear(self.ffn_in, w, f"{p}intermediate.dense")
            _copy_linear(self.ffn_out, w, f"{p}output.dense")
            _copy_norm(self.ffn_norm, w, f"{p}output.LayerNorm")


def _copy_linear(m: nn.Linear, w: WeightReader, name: str) -> None:
    m.weight.copy_(w.take(f"{name}.weight"))
    if m.bias is not None:
        m.bias.copy_(w.take(f"{name}.bias"))


def _copy_norm(m: nn.LayerNorm, w: WeightReader, name: str) -> None:
    m.weight.copy_(w.take(f"{name}.weight"))
    m.bias.copy_(w.take(f"{name}.bias"))


class BertEncoder(nn.Module):
    """Embeddings + transformer layers. ``position_offset`` is 0 for BERT and
    padding_idx + 1 for XLM-RoBERTa, whose positions start after padding."""

    def __init__(self, cfg: dict, backend: AttentionBackend, position_offset: int = 0):
        super().__init__()
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        if hidden % heads:
            raise ModelLoadError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ModelLoadError("only absolute position embeddings are supported for BERT-family models")
        eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.position_offset = position_offset
        self.word = nn.Embedding(int(cfg["vocab_size"]), hidden)
        self.position = nn.Embedding(int(cfg["max_position_embeddings"]), hidden)
        self.token_type = nn.Embedding(max(int(cfg.get("type_vocab_size", 1)), 1), hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        act = activation(str(cfg.get("hidden_act", "gelu")))
        self.layers = nn.ModuleList(
            BertLayer(hidden, heads, int(cfg["intermediate_size"]), eps, act, backend)
            for _ in range(int(cfg["num_hidden_layers"]))
        )
        self.attn_shape = AttnShape(heads, heads, hidden // heads, causal=False)

    def forward(self, x: StepInputs, token_types: torch.Tensor | None = None) -> torch.Tensor:
        h = self.word(x.token_ids) + self.position(x.positions + self.position_offset)
        if token_types is None:
            h = h + self.token_type.weight[0]
        else:
            h = h + self.token_type(token_types)
        h = self.norm(h)
        for layer in self.layers:
            h = layer(h, x.plan)
        return h

    def load(self, w: WeightReader) -> None:
        with torch.no_grad():
            self.word.weight.copy_(w.take("embeddings.word_embeddings.weight"))
            self.position.weight.copy_(w.take("embeddings.position_embeddings.weight"))
            self.token_type.weight.copy_(w.take("embeddings.token_type_embeddings.weight"))
            _copy_norm(self.norm, w, "embeddings.LayerNorm")
        for i, layer in enumerate(self.layers):
            layer.load(w, f"encoder.layer.{i}.")


class BertEmbedder(EmbeddingModel):
    """A BERT sentence embedder (dense output, mean or CLS pooling)."""

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__()
        self.encoder = BertEncoder(spec.hf_config, backend)
        self.pooling = spec.pooling
        self.dimension = spec.hidden_size

    def encode(self, x: StepInputs) -> torch.Tensor:
        return self.encoder(x)

    def load(self, w: WeightReader) -> None:
        self.encoder.load(w)
