"""MPNet encoders (all-mpnet-base-v2) over the flat token axis: BERT-style
post-norm layers without token types, RoBERTa-style positions, and a
learned relative position bias shared by every layer's attention.

The bias depends on each (query, key) pair's distance, so attention runs
on padded per-sequence blocks (``rose.models.padded``) with the bias and
the key padding as one additive mask.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import nn

from ..attention import AttentionBackend, AttnPlan
from ..config import ModelSpec
from ..errors import ModelLoadError
from ..loader import WeightReader
from .base import EmbeddingModel, StepInputs
from .bert import BertLayer
from .layers import activation, copy_fused, copy_linear, copy_norm, segment_cumsum
from .padded import PaddedAttention
from .sentence import SentenceHead

# transformers' MPNet buckets relative positions into 32 buckets (whatever
# relative_attention_num_buckets says) up to a distance of 128.
_BUCKETS = 32
_MAX_DISTANCE = 128
_PADDING_IDX = 1  # MPNet's embeddings hard-code it


def relative_buckets(relative: torch.Tensor) -> torch.Tensor:
    """T5-style buckets of ``key - query`` distances, as transformers' MPNet."""
    n = -relative
    half = _BUCKETS // 2
    ret = (n < 0).long() * half
    n = n.abs()
    exact = half // 2
    large = exact + (torch.log(n.float().clamp_min(1) / exact) / math.log(_MAX_DISTANCE / exact)
                     * (half - exact)).long()
    return ret + torch.where(n < exact, n, large.clamp_max(half - 1))


class MPNetLayer(BertLayer):
    """BERT's layer shape; MPNet's weight names."""

    peft_names = {
        "attention.attn.q": ("qkv", 0), "attention.attn.k": ("qkv", 1), "attention.attn.v": ("qkv", 2),
        "attention.attn.o": ("attn_out", None), "intermediate.dense": ("ffn_in", None),
        "output.dense": ("ffn_out", None)}

    def load(self, w: WeightReader, p: str) -> None:
        att = f"{p}attention."
        with torch.no_grad():
            copy_fused(self.qkv, w, [f"{att}attn.{n}" for n in "qkv"])
            copy_linear(self.attn_out, w, f"{att}attn.o")
            copy_norm(self.attn_norm, w, f"{att}LayerNorm")
            copy_linear(self.ffn_in, w, f"{p}intermediate.dense")
            copy_linear(self.ffn_out, w, f"{p}output.dense")
            copy_norm(self.ffn_norm, w, f"{p}output.LayerNorm")


class MPNetEncoder(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        hidden = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        if hidden % self.heads:
            raise ModelLoadError(f"hidden_size {hidden} is not a multiple of num_attention_heads {self.heads}")
        eps = float(cfg.get("layer_norm_eps", 1e-5))
        self.word = nn.Embedding(int(cfg["vocab_size"]), hidden)
        self.position = nn.Embedding(int(cfg["max_position_embeddings"]), hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.relative = nn.Embedding(int(cfg.get("relative_attention_num_buckets", _BUCKETS)), self.heads)
        self.attention = PaddedAttention()
        act = activation(str(cfg.get("hidden_act", "gelu")))
        self.layers = nn.ModuleList(
            MPNetLayer(hidden, self.heads, int(cfg["intermediate_size"]), eps, act, self.attention)
            for _ in range(int(cfg["num_hidden_layers"]))
        )

    def forward(self, x: StepInputs) -> torch.Tensor:
        real = (x.token_ids != _PADDING_IDX).long()
        pos = segment_cumsum(real, x.cu_seqlens, x.seg_ids) * real + _PADDING_IDX
        h = self.norm(self.word(x.token_ids) + self.position(pos.clamp_max(self.position.num_embeddings - 1)))
        plan = self.plan(x, h.shape[0], h.dtype)
        for layer in self.layers:
            h = layer(h, plan)
        return h

    def plan(self, x: StepInputs, tokens: int, dtype: torch.dtype) -> AttnPlan:
        """The padded layout and the bias (relative position + key padding),
        built once per step and shared by every layer."""
        def bias(lay, slots):
            rel = self.relative(relative_buckets(slots.unsqueeze(0) - slots.unsqueeze(1))).permute(2, 0, 1)
            return torch.where(lay.mask, rel.to(dtype).unsqueeze(0), float("-inf"))

        return self.attention.plan_for(x, tokens, bias)

    def load(self, w: WeightReader) -> None:
        with torch.no_grad():
            self.word.weight.copy_(w.take("embeddings.word_embeddings.weight"))
            self.position.weight.copy_(w.take("embeddings.position_embeddings.weight"))
            copy_norm(self.norm, w, "embeddings.LayerNorm")
            self.relative.weight.copy_(w.take("encoder.relative_attention_bias.weight"))
        for i, layer in enumerate(cast("list[MPNetLayer]", self.layers)):  # ModuleList yields nn.Module
            layer.load(w, f"encoder.layer.{i}.")


class MPNetEmbedder(EmbeddingModel):
    """An MPNet sentence embedder (dense, as its sentence-transformers
    pipeline says)."""

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__()
        self.encoder = MPNetEncoder(spec.hf_config)
        assert spec.pipeline is not None  # an embedder's spec always has one (config._pipeline)
        self.sentence = SentenceHead(spec.pipeline, spec.hidden_size)
        self.dimension = self.sentence.dimension
        self.kinds = tuple(spec.kinds())

    def encode(self, x: StepInputs) -> torch.Tensor:
        return self.encoder(x)

    def adapter_layers(self) -> list[nn.Module]:
        return list(self.encoder.layers)

    def load(self, w: WeightReader) -> None:
        self.encoder.load(w)
        self.sentence.load_files()
