"""ModernBERT encoders (gte-modernbert, nomic-modernbert) and
cross-encoders (gte-reranker-modernbert) over the flat token axis:
pre-norm layers (the first without its attention norm), fused QKV, RoPE
with one base for global and one for local layers, GeGLU MLP, no biases. Every ``global_attn_every_n_layers``-th layer attends globally
(the ragged backend); the others see a window of ``local_attention / 2``
tokens either side (``rose.models.padded``)."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from ..attention import AttentionBackend
from ..config import ModelSpec
from ..errors import ModelLoadError
from ..interface import OutputKind
from ..loader import WeightReader
from ..pooling import pool
from .base import EmbeddingModel, StepInputs
from .layers import activation, copy_linear, copy_norm
from .padded import PaddedAttention, window_mask
from .rope import apply_rope, rope_at, rope_table, rope_thetas
from .sentence import SentenceHead


def layer_kinds(cfg: dict) -> list[str]:
    """"full_attention" or "sliding_attention" per layer, from
    ``layer_types`` (transformers 5) or ``global_attn_every_n_layers``."""
    n = int(cfg["num_hidden_layers"])
    kinds = cfg.get("layer_types")
    if kinds is None:
        every = int(cfg.get("global_attn_every_n_layers", 3))
        kinds = ["sliding_attention" if i % every else "full_attention" for i in range(n)]
    if len(kinds) != n or set(kinds) - {"full_attention", "sliding_attention"}:
        raise ModelLoadError(f"layer_types {kinds} does not give full/sliding attention for {n} layers")
    return list(kinds)


class ModernBertLayer(nn.Module):
    # transformers' module names in a layer -> (this layer's linear, which
    # part of its output): where a LoRA adapter's matrices go (rose/adapters).
    peft_names: dict[str, tuple[str, int | None]] = {
        "attn.Wqkv": ("qkv", None), "attn.Wo": ("o", None), "mlp.Wi": ("wi", None), "mlp.Wo": ("wo", None)}

    def __init__(self, cfg: dict, first: bool, backend: AttentionBackend):
        super().__init__()
        hidden = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.head_dim = hidden // self.heads
        eps, bias = float(cfg.get("norm_eps", 1e-5)), bool(cfg.get("norm_bias", False))
        self.attn_norm = nn.Identity() if first else nn.LayerNorm(hidden, eps=eps, bias=bias)
        self.qkv = nn.Linear(hidden, 3 * hidden, bias=bool(cfg.get("attention_bias", False)))
        self.o = nn.Linear(hidden, hidden, bias=bool(cfg.get("attention_bias", False)))
        self.mlp_norm = nn.LayerNorm(hidden, eps=eps, bias=bias)
        ffn = int(cfg["intermediate_size"])
        self.wi = nn.Linear(hidden, 2 * ffn, bias=bool(cfg.get("mlp_bias", False)))
        self.wo = nn.Linear(ffn, hidden, bias=bool(cfg.get("mlp_bias", False)))
        self.act = activation(str(cfg.get("hidden_activation", "gelu")))
        self.backend = backend

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan) -> torch.Tensor:
        t = h.shape[0]
        q, k, v = self.qkv(self.attn_norm(h)).view(t, 3, self.heads, self.head_dim).unbind(1)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        a = self.backend.attend(q, k, v.contiguous(), plan, self.head_dim ** -0.5)
        h = h + self.o(a.reshape(t, -1))
        x, gate = self.wi(self.mlp_norm(h)).chunk(2, dim=-1)
        return h + self.wo(self.act(x) * gate)

    def load(self, w: WeightReader, p: str) -> None:
        with torch.no_grad():
            if isinstance(self.attn_norm, nn.LayerNorm):
                copy_norm(self.attn_norm, w, f"{p}attn_norm")
            copy_linear(self.qkv, w, f"{p}attn.Wqkv")
            copy_linear(self.o, w, f"{p}attn.Wo")
            copy_norm(self.mlp_norm, w, f"{p}mlp_norm")
            copy_linear(self.wi, w, f"{p}mlp.Wi")
            copy_linear(self.wo, w, f"{p}mlp.Wo")


class ModernBertEmbedder(EmbeddingModel):
    """A ModernBERT sentence embedder (dense, as its sentence-transformers
    pipeline says)."""

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__()
        cfg = spec.hf_config
        hidden = int(cfg["hidden_size"])
        heads = int(cfg["num_attention_heads"])
        if hidden % heads:
            raise ModelLoadError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        eps, bias = float(cfg.get("norm_eps", 1e-5)), bool(cfg.get("norm_bias", False))
        self.kinds_per_layer = layer_kinds(cfg)
        self.window = int(cfg.get("local_attention", 128)) // 2
        self.local = PaddedAttention()
        self.embed = nn.Embedding(int(cfg["vocab_size"]), hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=eps, bias=bias)
        self.layers = nn.ModuleList(
            ModernBertLayer(cfg, i == 0, backend if kind == "full_attention" else self.local)
            for i, kind in enumerate(self.kinds_per_layer)
        )
        self.final_norm = nn.LayerNorm(hidden, eps=eps, bias=bias)
        thetas = rope_thetas(cfg, "ModernBERT", {"full_attention": ("global_rope_theta", 160000.0),
                                                 "sliding_attention": ("local_rope_theta", 10000.0)})
        for kind, theta in thetas.items():
            self.register_buffer(f"rope_{kind}", rope_table(hidden // heads, theta, spec.max_length), persistent=False)
        self.sentence = SentenceHead(spec.pipeline, hidden) if spec.pipeline else None
        self.dimension = self.sentence.dimension if self.sentence else 0
        self.kinds = tuple(spec.kinds())

    def encode(self, x: StepInputs) -> torch.Tensor:
        h = self.embed_norm(self.embed(x.token_ids))
        tables = {kind: rope_at(getattr(self, f"rope_{kind}"), x.positions) for kind in set(self.kinds_per_layer)}
        local_plan = self.local.plan_for(x, h.shape[0], lambda lay, slots: window_mask(lay, slots, self.window)) \
            if "sliding_attention" in self.kinds_per_layer else None
        for layer, kind in zip(self.layers, self.kinds_per_layer):
            cos, sin = tables[kind]
            h = layer(h, cos, sin, x.plan if kind == "full_attention" else local_plan)
        return self.final_norm(h)

    def adapter_layers(self) -> list[nn.Module]:
        return list(self.layers)

    def load(self, w: WeightReader) -> None:
        with torch.no_grad():
            self.embed.weight.copy_(w.take("embeddings.tok_embeddings.weight"))
            copy_norm(self.embed_norm, w, "embeddings.norm")
            copy_norm(self.final_norm, w, "final_norm")
        for i, layer in enumerate(cast("list[ModernBertLayer]", self.layers)):  # ModuleList yields nn.Module
            layer.load(w, f"layers.{i}.")
        if self.sentence is not None:
            self.sentence.load_files()


class ModernBertCrossEncoder(ModernBertEmbedder):
    """``ModernBertForSequenceClassification`` (gte-reranker-modernbert):
    CLS or mean pooling (``classifier_pooling``), ``norm(act(dense(.)))``,
    then the classifier; one label is a ``score``, several ``classify``."""

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__(spec, backend)
        cfg = spec.hf_config
        hidden = int(cfg["hidden_size"])
        self.classifier_pooling = str(cfg.get("classifier_pooling", "cls"))
        if self.classifier_pooling not in ("cls", "mean"):
            raise ModelLoadError(f"ModernBERT classifier_pooling {self.classifier_pooling!r} is not one of cls, mean")
        self.head_dense = nn.Linear(hidden, hidden, bias=bool(cfg.get("classifier_bias", False)))
        self.head_act = activation(str(cfg.get("classifier_activation", "gelu")))
        self.head_norm = nn.LayerNorm(hidden, eps=float(cfg.get("norm_eps", 1e-5)),
                                      bias=bool(cfg.get("norm_bias", False)))
        self.classifier = nn.Linear(hidden, len(spec.labels))
        self.dimension = len(spec.labels)

    def head(self, kind: OutputKind, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        if kind not in self.kinds:
            return super().head(kind, hidden, x)
        pooled = pool(hidden, self.classifier_pooling, x.cu_seqlens, x.seg_ids, x.inv_lengths).to(hidden.dtype)
        logits = self.classifier(self.head_norm(self.head_act(self.head_dense(pooled)))).float()
        return torch.cat([logits, torch.sigmoid(logits)], dim=1) if kind is OutputKind.SCORE else logits

    def load(self, w: WeightReader) -> None:
        super().load(w)
        with torch.no_grad():
            copy_linear(self.head_dense, w, "head.dense")
            copy_norm(self.head_norm, w, "head.norm")
            copy_linear(self.classifier, w, "classifier")

