"""Qwen3 decoder embedders over the flat token axis: RMSNorm, RoPE, GQA
with per-head q/k norms, SwiGLU. Causal with last-token pooling
(Qwen3-Embedding), or bidirectional with mean pooling and a
``round(127 * tanh(x))`` output (pplx-embed-v1 style); see ``rose.config``
for how a directory says which."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import AttentionBackend
from ..config import ModelSpec
from ..errors import ModelLoadError
from ..interface import OutputKind
from ..loader import WeightReader
from .base import EmbeddingModel, StepInputs
from .layers import RMSNorm, copy_fused, copy_linear, copy_norm
from .rope import apply_rope, rope_at, rope_table, rope_theta
from .sentence import SentenceHead


class Qwen3Layer(nn.Module):
    # transformers' module names in a layer -> (this layer's linear, which
    # part of its output): where a LoRA adapter's matrices go (rose/adapters).
    peft_names: dict[str, tuple[str, int | None]] = {
        "self_attn.q_proj": ("qkv", 0), "self_attn.k_proj": ("qkv", 1), "self_attn.v_proj": ("qkv", 2),
        "self_attn.o_proj": ("o", None), "mlp.gate_proj": ("gate_up", 0), "mlp.up_proj": ("gate_up", 1),
        "mlp.down_proj": ("down", None)}

    def __init__(self, cfg: dict, backend: AttentionBackend):
        super().__init__()
        hidden = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.kv_heads = int(cfg.get("num_key_value_heads") or self.heads)
        self.head_dim = int(cfg.get("head_dim") or hidden // self.heads)
        if self.heads % self.kv_heads:
            raise ModelLoadError(f"num_attention_heads {self.heads} is not a multiple of num_key_value_heads {self.kv_heads}")
        eps = float(cfg.get("rms_norm_eps", 1e-6))
        bias = bool(cfg.get("attention_bias", False))
        ffn = int(cfg["intermediate_size"])
        self.scale = self.head_dim ** -0.5
        self.splits = [self.heads * self.head_dim, self.kv_heads * self.head_dim, self.kv_heads * self.head_dim]
        self.qkv = nn.Linear(hidden, sum(self.splits), bias=bias)
        self.o = nn.Linear(self.heads * self.head_dim, hidden, bias=bias)
        self.q_norm = RMSNorm(self.head_dim, eps)
        self.k_norm = RMSNorm(self.head_dim, eps)
        self.attn_norm = RMSNorm(hidden, eps)
        self.ffn_norm = RMSNorm(hidden, eps)
        self.gate_up = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)
        self.peft_parts = {"qkv": self.splits, "gate_up": [ffn, ffn]}
        self.backend = backend

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan) -> torch.Tensor:
        t = h.shape[0]
        q, k, v = self.qkv(self.attn_norm(h)).split(self.splits, dim=-1)
        q = apply_rope(self.q_norm(q.view(t, self.heads, self.head_dim)), cos, sin)
        k = apply_rope(self.k_norm(k.view(t, self.kv_heads, self.head_dim)), cos, sin)
        v = v.view(t, self.kv_heads, self.head_dim)
        a = self.backend.attend(q, k, v, plan, self.scale)
        h = h + self.o(a.reshape(t, -1))
        gate, up = self.gate_up(self.ffn_norm(h)).chunk(2, dim=-1)
        return h + self.down(F.silu(gate) * up)

    def load(self, w: WeightReader, p: str) -> None:
        att = f"{p}self_attn."
        with torch.no_grad():
            copy_fused(self.qkv, w, [f"{att}{n}_proj" for n in "qkv"])
            copy_linear(self.o, w, f"{att}o_proj")
            copy_norm(self.q_norm, w, f"{att}q_norm")
            copy_norm(self.k_norm, w, f"{att}k_norm")
            copy_norm(self.attn_norm, w, f"{p}input_layernorm")
            copy_norm(self.ffn_norm, w, f"{p}post_attention_layernorm")
            copy_fused(self.gate_up, w, [f"{p}mlp.gate_proj", f"{p}mlp.up_proj"])
            copy_linear(self.down, w, f"{p}mlp.down_proj")


class Qwen3Embedder(EmbeddingModel):
    """A Qwen3 decoder used as an embedder (no KV cache, no LM head)."""

    rope: torch.Tensor  # a buffer

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__()
        cfg = spec.hf_config
        if cfg.get("use_sliding_window"):
            raise ModelLoadError("Qwen3 with sliding-window attention is not supported")
        if str(cfg.get("hidden_act", "silu")) != "silu":
            raise ModelLoadError(f"Qwen3 activation {cfg.get('hidden_act')!r} is not supported")
        hidden = int(cfg["hidden_size"])
        self.embed = nn.Embedding(int(cfg["vocab_size"]), hidden)
        self.layers = nn.ModuleList(Qwen3Layer(cfg, backend) for _ in range(int(cfg["num_hidden_layers"])))
        self.norm = RMSNorm(hidden, float(cfg.get("rms_norm_eps", 1e-6)))
        head_dim = cast(Qwen3Layer, self.layers[0]).head_dim if len(self.layers) else hidden
        # Positions never exceed the served maximum length.
        self.register_buffer("rope", rope_table(head_dim, rope_theta(cfg), spec.max_length), persistent=False)
        self.causal = spec.causal
        self.sentence = SentenceHead(spec.pipeline, hidden) if spec.pipeline else None
        self.quantization = spec.quantization
        self.dimension = self.sentence.dimension if self.sentence else 0
        self.kinds = tuple(spec.kinds())

    def encode(self, x: StepInputs) -> torch.Tensor:
        h = self.embed(x.token_ids)
        cos, sin = rope_at(self.rope, x.positions)
        for layer in self.layers:
            h = layer(h, cos, sin, x.plan)
        return self.norm(h)

    def adapter_layers(self) -> list[nn.Module]:
        return list(self.layers)

    def dense(self, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        pooled = super().dense(hidden, x)
        if self.quantization == "tanh_int8":
            pooled = torch.round(127.0 * torch.tanh(pooled))
        return pooled

    def load(self, w: WeightReader) -> None:
        with torch.no_grad():
            self.embed.weight.copy_(w.take("embed_tokens.weight"))
            copy_norm(self.norm, w, "norm")
        for i, layer in enumerate(cast("list[Qwen3Layer]", self.layers)):  # ModuleList yields nn.Module
            layer.load(w, f"layers.{i}.")
        if self.sentence is not None:
            self.sentence.load_files()


# Qwen3-Reranker's published prompt (its model card) with the card's default
# instruction; the host fills {query} and {document} and tokenizes the text
# without special tokens.
QWEN3_RERANK_TEMPLATE = (
    "<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the "
    "Instruct provided. Note that the answer can only be \"yes\" or \"no\".<|im_end|>\n<|im_start|>user\n"
    "<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n"
    "<Query>: {query}\n<Document>: {document}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n")


class Qwen3Reranker(Qwen3Embedder):
    """A Qwen3 causal LM used as a reranker (Qwen3-Reranker): the host
    formats each (query, document) pair in the model's prompt, and the
    score is ``logit(yes) - logit(no)`` at the last token, with its
    sigmoid (= the softmax probability of "yes" over the two). Only the
    two LM-head rows are kept."""

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__(spec, backend)
        assert spec.score_tokens is not None  # build_model picks this class only for a causal-LM reranker
        self.true_id, self.false_id = spec.score_tokens
        self.tied = bool(spec.hf_config.get("tie_word_embeddings", False))
        self.rows = nn.Linear(int(spec.hf_config["hidden_size"]), 1 if self.false_id is None else 2, bias=False)
        self.dimension = 1
        self.kinds = (OutputKind.SCORE,)
        self.pair_template = QWEN3_RERANK_TEMPLATE

    def head(self, kind: OutputKind, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        if kind is not OutputKind.SCORE:
            return super().head(kind, hidden, x)
        logits = self.rows(hidden[x.cu_seqlens[1:].long() - 1]).float()
        raw = logits[:, :1] if self.false_id is None else logits[:, :1] - logits[:, 1:]
        return torch.cat([raw, torch.sigmoid(raw)], dim=1)

    def load(self, w: WeightReader) -> None:
        super().load(w)
        table = self.embed.weight if self.tied or "lm_head.weight" not in w else w.take("lm_head.weight")
        ids = [self.true_id] + ([] if self.false_id is None else [self.false_id])
        with torch.no_grad():
            self.rows.weight.copy_(table[ids])
