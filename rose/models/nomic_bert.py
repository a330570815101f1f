"""NomicBERT encoders (nomic-embed-text-v1.5) as transformers'
``NomicBertModel`` computes them: BERT-style post-norm layers with RoPE
instead of a position table, SwiGLU MLP, no biases; token type 0 added to
every token. Weights are read in the layout transformers saves (the
original one: ``emb_ln``, ``encoder.layers.N.attn.Wqkv``, ``mlp.fc11`` (up),
``fc12`` (gate), ``fc2``, ``norm1``, ``norm2``). A config.json in the
remote-code style (``n_embd``, ``n_layer``, ...) is refused with a clear
error: its rotary options are not read here."""

from __future__ import annotations

from typing import cast

import torch
from torch import nn

from ..attention import AttentionBackend
from ..config import ModelSpec
from ..errors import ModelLoadError
from ..loader import WeightReader
from .base import EmbeddingModel, StepInputs
from .layers import activation, copy_fused, copy_linear, copy_norm
from .rope import apply_rope, rope_at, rope_table, rope_theta
from .sentence import SentenceHead


class NomicBertLayer(nn.Module):
    # Module names in a layer -> (this layer's linear, which part of its
    # output): where a LoRA adapter's matrices go (rose/adapters). Both
    # layouts: transformers' NomicBertModel (q_proj, ...) and the original
    # remote code's (Wqkv, fc11 = up, fc12 = gate, ...).
    peft_names: dict[str, tuple[str, int | None]] = {
        "self_attn.q_proj": ("qkv", 0), "self_attn.k_proj": ("qkv", 1), "self_attn.v_proj": ("qkv", 2),
        "self_attn.o_proj": ("o", None), "mlp.gate_proj": ("gate_up", 0), "mlp.up_proj": ("gate_up", 1),
        "mlp.down_proj": ("down", None),
        "attn.Wqkv": ("qkv", None), "attn.out_proj": ("o", None), "mlp.fc12": ("gate_up", 0),
        "mlp.fc11": ("gate_up", 1), "mlp.fc2": ("down", None)}

    def __init__(self, cfg: dict, backend: AttentionBackend):
        super().__init__()
        hidden = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.head_dim = int(cfg.get("head_dim") or hidden // self.heads)
        eps = float(cfg.get("layer_norm_eps", 1e-12))
        ffn = int(cfg["intermediate_size"])
        self.qkv = nn.Linear(hidden, 3 * self.heads * self.head_dim, bias=False)
        self.o = nn.Linear(self.heads * self.head_dim, hidden, bias=False)
        self.attn_norm = nn.LayerNorm(hidden, eps=eps)
        self.gate_up = nn.Linear(hidden, 2 * ffn, bias=False)
        self.down = nn.Linear(ffn, hidden, bias=False)
        self.peft_parts = {"qkv": [self.heads * self.head_dim] * 3, "gate_up": [ffn, ffn]}
        self.mlp_norm = nn.LayerNorm(hidden, eps=eps)
        self.act = activation(str(cfg.get("hidden_act", "silu")))
        self.backend = backend

    def forward(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, plan) -> torch.Tensor:
        t = h.shape[0]
        q, k, v = self.qkv(h).view(t, 3, self.heads, self.head_dim).unbind(1)
        a = self.backend.attend(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v.contiguous(), plan,
                                self.head_dim ** -0.5)
        h = self.attn_norm(h + self.o(a.reshape(t, -1)))
        gate, up = self.gate_up(h).chunk(2, dim=-1)
        return self.mlp_norm(h + self.down(self.act(gate) * up))

    def load(self, w: WeightReader, p: str) -> None:
        with torch.no_grad():
            copy_linear(self.qkv, w, f"{p}attn.Wqkv")
            copy_linear(self.o, w, f"{p}attn.out_proj")
            copy_norm(self.attn_norm, w, f"{p}norm1")
            copy_fused(self.gate_up, w, [f"{p}mlp.fc12", f"{p}mlp.fc11"])  # gate, up
            copy_linear(self.down, w, f"{p}mlp.fc2")
            copy_norm(self.mlp_norm, w, f"{p}norm2")


class NomicBertEmbedder(EmbeddingModel):
    """A NomicBERT sentence embedder with its sentence-transformers pipeline."""

    rope: torch.Tensor  # a buffer

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__()
        cfg = spec.hf_config
        if "hidden_size" not in cfg and "n_embd" in cfg:
            raise ModelLoadError(f"{spec.path}: a NomicBERT config.json in the remote-code layout (n_embd, ...) is "
                                 "not supported; use one saved by transformers' NomicBertModel")
        hidden = int(cfg["hidden_size"])
        self.word = nn.Embedding(int(cfg["vocab_size"]), hidden)
        self.token_type = nn.Embedding(max(int(cfg.get("type_vocab_size", 1)), 1), hidden)
        self.norm = nn.LayerNorm(hidden, eps=float(cfg.get("layer_norm_eps", 1e-12)))
        self.layers = nn.ModuleList(NomicBertLayer(cfg, backend) for _ in range(int(cfg["num_hidden_layers"])))
        head_dim = int(cfg.get("head_dim") or hidden // int(cfg["num_attention_heads"]))
        self.register_buffer("rope", rope_table(head_dim, rope_theta(cfg, default=1000.0), spec.max_length),
                             persistent=False)
        assert spec.pipeline is not None  # an embedder's spec always has one (config._pipeline)
        self.sentence = SentenceHead(spec.pipeline, hidden)
        self.dimension = self.sentence.dimension
        self.kinds = tuple(spec.kinds())

    def encode(self, x: StepInputs) -> torch.Tensor:
        h = self.norm(self.word(x.token_ids) + self.token_type.weight[0])
        cos, sin = rope_at(self.rope, x.positions)
        for layer in self.layers:
            h = layer(h, cos, sin, x.plan)
        return h

    def adapter_layers(self) -> list[nn.Module]:
        return list(self.layers)

    def load(self, w: WeightReader) -> None:
        with torch.no_grad():
            self.word.weight.copy_(w.take("embeddings.word_embeddings.weight"))
            self.token_type.weight.copy_(w.take("embeddings.token_type_embeddings.weight"))
            copy_norm(self.norm, w, "emb_ln")
        for i, layer in enumerate(cast("list[NomicBertLayer]", self.layers)):  # ModuleList yields nn.Module
            layer.load(w, f"encoder.layers.{i}.")
        self.sentence.load_files()
