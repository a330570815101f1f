"""The ViT vision tower of CLIP and SigLIP over a batch of images of one
resolution, and the pre-norm layer both of their towers (text and vision)
are made of.

Each image is one sequence of the flat token axis, all of equal length, so
attention goes through the same ``AttentionBackend.attend(q, k, v, plan,
scale)`` as the text models, with ``cu_seqlens`` built from the lengths.
Pooling is each family's: CLIP takes the class token, normalised
(``post_layernorm``), then ``visual_projection``; SigLIP normalises every
token and pools them with its multi-head attention head (a learned probe
attending to the image's tokens)."""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from ..attention import AttentionBackend, AttnPlan, AttnShape
from ..errors import InvalidBatchError, ModelLoadError
from ..loader import WeightReader
from .layers import activation, copy_fused, copy_linear, copy_norm

FAMILIES = ("clip", "siglip")


def attn_shape(cfg: dict, causal: bool) -> AttnShape:
    """The attention shape of one tower (its ``text_config`` or
    ``vision_config``), for choosing its backend."""
    hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
    if hidden % heads:
        raise ModelLoadError(f"hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
    return AttnShape(heads, heads, hidden // heads, causal)


def ragged_plan(backend: AttentionBackend, lengths: list[int], device: torch.device, causal: bool) -> AttnPlan:
    """The backend's plan for sequences of ``lengths`` laid end to end on
    the flat token axis (``cu_seqlens`` as the text models have it)."""
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
    return backend.plan(cu.to(device), lengths, max(lengths), causal)


class EncoderLayer(nn.Module):
    """CLIP's and SigLIP's transformer layer, in either tower:
    ``h + attn(norm1(h))``, then ``h + mlp(norm2(h))``."""

    def __init__(self, cfg: dict, backend: AttentionBackend):
        super().__init__()
        shape = attn_shape(cfg, causal=False)
        hidden, ffn = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
        eps = float(cfg.get("layer_norm_eps", 1e-5))
        self.heads, self.head_dim = shape.num_heads, shape.head_dim
        self.scale = self.head_dim**-0.5
        self.norm1 = nn.LayerNorm(hidden, eps=eps)
        # Query, key and value as one matmul.
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.act = activation(str(cfg.get("hidden_act", "quick_gelu")))
        self.backend = backend

    def forward(self, h: torch.Tensor, plan: AttnPlan) -> torch.Tensor:
        t = h.shape[0]
        q, k, v = self.qkv(self.norm1(h)).view(t, 3, self.heads, self.head_dim).unbind(1)
        h = h + self.out(self.backend.attend(q, k, v, plan, self.scale).reshape(t, -1))
        return h + self.fc2(self.act(self.fc1(self.norm2(h))))

    def load(self, w: WeightReader, p: str) -> None:
        with torch.no_grad():
            copy_norm(self.norm1, w, f"{p}layer_norm1")
            copy_fused(self.qkv, w, [f"{p}self_attn.{n}_proj" for n in "qkv"])
            copy_linear(self.out, w, f"{p}self_attn.out_proj")
            copy_norm(self.norm2, w, f"{p}layer_norm2")
            copy_linear(self.fc1, w, f"{p}mlp.fc1")
            copy_linear(self.fc2, w, f"{p}mlp.fc2")


class Encoder(nn.Module):
    """A tower's stack of layers over the flat token axis."""

    def __init__(self, cfg: dict, backend: AttentionBackend):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(cfg, backend) for _ in range(int(cfg["num_hidden_layers"])))

    def forward(self, h: torch.Tensor, plan: AttnPlan) -> torch.Tensor:
        for layer in self.layers:
            h = layer(h, plan)
        return h

    def load(self, w: WeightReader, prefix: str) -> None:
        for i, layer in enumerate(cast("list[EncoderLayer]", self.layers)):  # ModuleList yields nn.Module
            layer.load(w, f"{prefix}layers.{i}.")


class AttentionPoolingHead(nn.Module):
    """SigLIP's multi-head attention pooling (transformers'
    ``SiglipMultiheadAttentionPoolingHead``): one learned probe attends to
    an image's tokens, then a residual MLP. Every image has the same token
    count and a single query, so this is one dense SDPA call over
    ``[images, heads, tokens, dim]``, not a ragged backend's work."""

    def __init__(self, cfg: dict):
        super().__init__()
        shape = attn_shape(cfg, causal=False)
        hidden, ffn = int(cfg["hidden_size"]), int(cfg["intermediate_size"])
        eps = float(cfg.get("layer_norm_eps", 1e-6))
        self.heads, self.head_dim = shape.num_heads, shape.head_dim
        self.probe = nn.Parameter(torch.zeros(hidden))
        self.q = nn.Linear(hidden, hidden)
        self.kv = nn.Linear(hidden, 2 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.fc1 = nn.Linear(hidden, ffn)
        self.fc2 = nn.Linear(ffn, hidden)
        self.act = activation(str(cfg.get("hidden_act", "gelu_pytorch_tanh")))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """[images, tokens, hidden] → [images, hidden]."""
        n, t, d = h.shape
        q = self.q(self.probe).view(1, self.heads, 1, self.head_dim).expand(n, -1, -1, -1)
        k, v = self.kv(h).view(n, t, 2, self.heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        x = self.out(F.scaled_dot_product_attention(q, k, v).reshape(n, d))
        return x + self.fc2(self.act(self.fc1(self.norm(x))))

    def load(self, w: WeightReader, p: str) -> None:
        hidden = self.probe.shape[0]
        with torch.no_grad():
            self.probe.copy_(w.take(f"{p}probe").reshape(hidden))
            # nn.MultiheadAttention keeps q, k and v stacked in one matrix.
            weight, bias = w.take(f"{p}attention.in_proj_weight"), w.take(f"{p}attention.in_proj_bias")
            self.q.weight.copy_(weight[:hidden])
            self.q.bias.copy_(bias[:hidden])
            self.kv.weight.copy_(weight[hidden:])
            self.kv.bias.copy_(bias[hidden:])
            copy_linear(self.out, w, f"{p}attention.out_proj")
            copy_norm(self.norm, w, f"{p}layernorm")
            copy_linear(self.fc1, w, f"{p}mlp.fc1")
            copy_linear(self.fc2, w, f"{p}mlp.fc2")


class VisionTower(nn.Module):
    """CLIP's or SigLIP's vision model (``vision_config``) with its pooling,
    and for CLIP its projection: images ``[N, C, H, W]`` at the configured
    size → pooled features ``[N, D]``.

    CLIP: a class token before the patches, ``pre_layrnorm`` before the
    layers, the class token's ``post_layernorm`` state, ``visual_projection``.
    SigLIP: no class token (the patch convolution has a bias), no norm
    before the layers, ``post_layernorm`` on every token, the attention
    pooling head; its image features are the head's output."""

    # Its matmuls have 50 or more rows an image: there MKL's sgemm beat the
    # 16-row packed oneDNN layout (rose/models/packed.py), 16 ViT-B/32
    # images at 2 threads 466 against 568 ms, so its linears stay plain.
    blas_linears = True

    def __init__(self, cfg: dict, backend: AttentionBackend, family: str, projection_dim: int | None = None):
        super().__init__()
        if family not in FAMILIES:
            raise ModelLoadError(f"vision tower family {family!r} is not one of {', '.join(FAMILIES)}")
        if family == "siglip" and not cfg.get("vision_use_head", True):
            raise ModelLoadError(
                "SigLIP without its attention pooling head (vision_use_head false) has no image features to serve"
            )
        hidden = int(cfg["hidden_size"])
        eps = float(cfg.get("layer_norm_eps", 1e-5))
        self.family = family
        self.channels = int(cfg.get("num_channels", 3))
        self.image_size = int(cfg["image_size"])
        self.patch = int(cfg["patch_size"])
        self.grid = self.image_size // self.patch
        clip = family == "clip"
        # The patch convolution (kernel = stride = patch) as one matmul over
        # each patch's pixels, flattened in the convolution's (C, P, P) order.
        self.patch_embed = nn.Linear(self.channels * self.patch**2, hidden, bias=not clip)
        self.class_token = nn.Parameter(torch.zeros(hidden)) if clip else None
        self.tokens = self.grid**2 + (1 if clip else 0)
        self.position = nn.Embedding(self.tokens, hidden)
        self.pre_norm = nn.LayerNorm(hidden, eps=eps) if clip else None
        self.encoder = Encoder(cfg, backend)
        self.post_norm = nn.LayerNorm(hidden, eps=eps)
        self.head = None if clip else AttentionPoolingHead(cfg)
        self.projection = nn.Linear(hidden, projection_dim, bias=False) if projection_dim else None
        self.backend = backend
        self.dimension = projection_dim or hidden

    def plan(self, images: int, device: torch.device) -> AttnPlan:
        """The attention plan of ``images`` images (each one sequence of
        ``tokens``): made once per bucket by a step on static buffers, since
        making it copies to the device, which a CUDA graph cannot capture."""
        return ragged_plan(self.backend, [self.tokens] * images, device, causal=False)

    def forward(self, pixels: torch.Tensor, plan: AttnPlan | None = None) -> torch.Tensor:
        """``plan``: ``self.plan(N, device)``, made here when not given."""
        n, c, size = pixels.shape[0], self.channels, self.image_size
        if pixels.dim() != 4 or tuple(pixels.shape[1:]) != (c, size, size) or n == 0:
            raise InvalidBatchError(f"images must be [N, {c}, {size}, {size}] with N >= 1, got {list(pixels.shape)}")
        g, p = self.grid, self.patch
        x = pixels.to(self.patch_embed.weight.dtype)
        x = x.reshape(n, c, g, p, g, p).permute(0, 2, 4, 1, 3, 5).reshape(n * g * g, c * p * p)
        h = self.patch_embed(x).view(n, g * g, -1)
        if self.class_token is not None:
            h = torch.cat([self.class_token.expand(n, 1, -1), h], dim=1)
        h = (h + self.position.weight).reshape(n * self.tokens, -1)
        if self.pre_norm is not None:
            h = self.pre_norm(h)
        h = self.encoder(h, plan if plan is not None else self.plan(n, h.device))
        h = h.view(n, self.tokens, -1)
        pooled = self.post_norm(h[:, 0]) if self.head is None else self.head(self.post_norm(h))
        return pooled if self.projection is None else self.projection(pooled)

    def load(self, w: WeightReader, prefix: str = "vision_model.", projection: str = "visual_projection") -> None:
        e = f"{prefix}embeddings."
        with torch.no_grad():
            conv = w.take(f"{e}patch_embedding.weight")
            self.patch_embed.weight.copy_(conv.reshape(conv.shape[0], -1))
            if self.patch_embed.bias is not None:
                self.patch_embed.bias.copy_(w.take(f"{e}patch_embedding.bias"))
            if self.class_token is not None:
                self.class_token.copy_(w.take(f"{e}class_embedding"))
            self.position.weight.copy_(w.take(f"{e}position_embedding.weight"))
            if self.pre_norm is not None:
                copy_norm(self.pre_norm, w, f"{prefix}pre_layrnorm")  # sic: transformers' name
            copy_norm(self.post_norm, w, f"{prefix}post_layernorm")
            if self.projection is not None:
                copy_linear(self.projection, w, projection)
        self.encoder.load(w, f"{prefix}encoder.")
        if self.head is not None:
            self.head.load(w, f"{prefix}head.")
