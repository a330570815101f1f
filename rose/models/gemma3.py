"""Gemma3 text encoders as EmbeddingGemma uses them: bidirectional
attention, scaled embeddings, RMSNorm with ``1 + weight``, sandwich norms
around attention and MLP, q/k norms, GQA, RoPE with one base for global and
one for local layers, GeGLU (tanh) MLP. Global layers run on the ragged
backend; sliding layers see ``sliding_window / 2`` tokens either side
(transformers' bidirectional window) through ``rose.models.padded``. The
sentence-transformers pipeline (mean pooling, Dense projections,
Normalize; Matryoshka truncation by request) follows as for every model."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from ..attention import AttentionBackend
from ..config import ModelSpec
from ..errors import ModelLoadError
from ..loader import WeightReader
from .base import EmbeddingModel, StepInputs
from .layers import activation, copy_linear, copy_norm
from .modernbert import layer_kinds
from .padded import PaddedAttention, window_mask
from .rope import apply_rope, rope_at, rope_table, rope_thetas
from .sentence import SentenceHead


class GemmaRMSNorm(nn.Module):
    """RMSNorm scaled by ``1 + weight``, all in float32 (as Gemma3)."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * (1.0 + self.weight.float())).type_as(x)


class Gemma3Layer(nn.Module):
    def __init__(self, cfg: dict, backend: AttentionBackend):
        super().__init__()
        hidden = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.kv_heads = int(cfg.get("num_key_value_heads") or self.heads)
        self.head_dim = int(cfg.get("head_dim") or hidden // self.heads)
        eps = float(cfg.get("rms_norm_eps", 1e-6))
        bias = bool(cfg.get("attention_bias", False))
        self.splits = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        self.qkv = nn.Linear(hidden, sum(self.splits), bias=bias)
        self.o = nn.Linear(self.heads * self.head_dim, hidden, bias=bias)
        self.q_norm = GemmaRMSNorm(self.head_dim, eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, eps)
        self.norms = nn.ModuleList(GemmaRMSNorm(hidden, eps) for _ in range(4))
        ffn = int(cfg["intermediate_size"])
        self.gate = nn.Linear(hidden, ffn, bias=False)
        self.up = nn.Linear(hidden, ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)
        self.act = activation(str(cfg.get("hidden_activation", "gelu_pytorch_tanh")))
        self.scale = float(cfg.get("query_pre_attn_scalar", self.head_dim)) ** -0.5
        self.backend = backend

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan) -> torch.Tensor:
        t = h.shape[0]
        pre_attn, post_attn, pre_mlp, post_mlp = self.norms
        q, k, v = self.qkv(pre_attn(h)).split(self.splits, dim=-1)
        q = apply_rope(self.q_norm(q.view(t, self.heads, self.head_dim)), cos, sin)
        k = apply_rope(self.k_norm(k.view(t, self.kv_heads, self.head_dim)), cos, sin)
        a = self.backend.attend(q, k, v.reshape(t, self.kv_heads, self.head_dim), plan, self.scale)
        h = h + post_attn(self.o(a.reshape(t, -1)))
        x = pre_mlp(h)
        return h + post_mlp(self.down(self.act(self.gate(x)) * self.up(x)))

    def load(self, w: WeightReader, p: str) -> None:
        att = f"{p}self_attn."
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([w.take(f"{att}{n}_proj.weight") for n in "qkv"]))
            if self.qkv.bias is not None:
                self.qkv.bias.copy_(torch.cat([w.take(f"{att}{n}_proj.bias") for n in "qkv"]))
            copy_linear(self.o, w, f"{att}o_proj")
            copy_norm(self.q_norm, w, f"{att}q_norm")
            copy_norm(self.k_norm, w, f"{att}k_norm")
            for norm, name in zip(self.norms, ("input_layernorm", "post_attention_layernorm",
                                               "pre_feedforward_layernorm", "post_feedforward_layernorm")):
                copy_norm(norm, w, f"{p}{name}")
            copy_linear(self.gate, w, f"{p}mlp.gate_proj")
            copy_linear(self.up, w, f"{p}mlp.up_proj")
            copy_linear(self.down, w, f"{p}mlp.down_proj")


class Gemma3Embedder(EmbeddingModel):
    """A bidirectional Gemma3 text encoder (EmbeddingGemma) with its
    sentence-transformers pipeline."""

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__()
        cfg = spec.hf_config
        if not cfg.get("use_bidirectional_attention"):
            raise ModelLoadError("Gemma3 without use_bidirectional_attention (a causal LM) is not supported as an "
                                 "embedder")
        if cfg.get("attn_logit_softcapping"):
            raise ModelLoadError("Gemma3 attn_logit_softcapping is not supported")
        hidden = int(cfg["hidden_size"])
        if cfg.get("layer_types") is None:  # older configs: every 6th layer global
            every = int(cfg.get("sliding_window_pattern", 6))
            cfg = {**cfg, "layer_types": ["sliding_attention" if (i + 1) % every else "full_attention"
                                          for i in range(int(cfg["num_hidden_layers"]))]}
        self.kinds_per_layer = layer_kinds(cfg)
        # transformers keeps |i - j| < sliding_window // 2 + 1 for bidirectional models.
        self.window = int(cfg.get("sliding_window") or 4096) // 2
        self.local = PaddedAttention()
        self.embed = nn.Embedding(int(cfg["vocab_size"]), hidden)
        # A buffer, so it is cast with the model (transformers rounds the
        # scale to the model's dtype too).
        self.register_buffer("embed_scale", torch.tensor(hidden ** 0.5), persistent=False)
        self.layers = nn.ModuleList(Gemma3Layer(cfg, backend if kind == "full_attention" else self.local)
                                    for kind in self.kinds_per_layer)
        self.norm = GemmaRMSNorm(hidden, float(cfg.get("rms_norm_eps", 1e-6)))
        head_dim = int(cfg.get("head_dim") or hidden // int(cfg["num_attention_heads"]))
        thetas = rope_thetas(cfg, "Gemma3", {"full_attention": ("rope_theta", 1_000_000.0),
                                             "sliding_attention": ("rope_local_base_freq", 10_000.0)})
        for kind, theta in thetas.items():
            self.register_buffer(f"rope_{kind}", rope_table(head_dim, theta, spec.max_length), persistent=False)
        assert spec.pipeline is not None  # an embedder's spec always has one (config._pipeline)
        self.sentence = SentenceHead(spec.pipeline, hidden)
        self.dimension = self.sentence.dimension
        self.kinds = tuple(spec.kinds())

    def encode(self, x: StepInputs) -> torch.Tensor:
        h = self.embed(x.token_ids) * self.embed_scale
        tables = {kind: rope_at(getattr(self, f"rope_{kind}"), x.positions) for kind in set(self.kinds_per_layer)}
        local_plan = self.local.plan_for(x, h.shape[0], lambda lay, slots: window_mask(lay, slots, self.window)) \
            if "sliding_attention" in self.kinds_per_layer else None
        for layer, kind in zip(self.layers, self.kinds_per_layer):
            cos, sin = tables[kind]
            h = layer(h, cos, sin, x.plan if kind == "full_attention" else local_plan)
        return self.norm(h)

    def load(self, w: WeightReader) -> None:
        with torch.no_grad():
            self.embed.weight.copy_(w.take("embed_tokens.weight"))
            copy_norm(self.norm, w, "norm")
        for i, layer in enumerate(cast("list[Gemma3Layer]", self.layers)):  # ModuleList yields nn.Module
            layer.load(w, f"layers.{i}.")
        self.sentence.load_files()

