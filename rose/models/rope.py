"""Rotary position embeddings, as Qwen3, Gemma3, ModernBERT and NomicBERT
use them: the base (``theta``) read from config.json, one cos/sin table per
base built at load, its rows looked up per step, and the rotation of
queries and keys. Only plain (unscaled) RoPE is supported."""

from __future__ import annotations

import torch

from ..errors import ModelLoadError


def rope_theta(cfg: dict, default: float = 10000.0) -> float:
    """The RoPE base of a model with one base for every layer."""
    params = cfg.get("rope_parameters") or {}
    scaling = cfg.get("rope_scaling")
    kind = params.get("rope_type", "default")
    if kind != "default" or (scaling and scaling.get("rope_type", scaling.get("type")) != "default"):
        raise ModelLoadError(f"RoPE scaling {kind if kind != 'default' else scaling} is not supported")
    return float(params.get("rope_theta", cfg.get("rope_theta", default)))


def rope_thetas(cfg: dict, model: str, older_keys: dict[str, tuple[str, float]]) -> dict[str, float]:
    """The RoPE base per layer kind ("full_attention", "sliding_attention")
    of a model with one base for global and one for local layers: from
    ``rope_parameters[kind]`` (transformers 5), else from the flat key of
    older configs that ``older_keys[kind]`` names, else its default."""
    params = cfg.get("rope_parameters") or {}
    out = {}
    for kind, (old_key, default) in older_keys.items():
        p = params.get(kind) or {}
        if p.get("rope_type", "default") != "default":
            raise ModelLoadError(f"{model} RoPE scaling {p.get('rope_type')!r} ({kind}) is not supported")
        out[kind] = float(p.get("rope_theta", cfg.get(old_key, default)))
    return out


def rope_table(head_dim: int, theta: float, positions: int) -> torch.Tensor:
    """[positions, 2, head_dim]: cos and sin per position, computed in
    float32 as transformers does (cast to the model dtype with the model)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = torch.arange(positions, dtype=torch.float32).unsqueeze(1) * inv_freq
    emb = torch.cat([freqs, freqs], dim=-1)
    return torch.stack([emb.cos(), emb.sin()], dim=1)


def rope_at(table: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each [T, 1, head_dim], of the flat tokens' positions.
    Real positions stay under the served maximum (the engine checks); a
    graph bucket's filler segment may run past it, and its rows are
    discarded, so clamping keeps the lookup in range without a branch."""
    cos, sin = table[positions.long().clamp_max(table.shape[0] - 1)].unsqueeze(2).unbind(1)
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [T, H, D]; cos, sin: [T, 1, D]."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin
