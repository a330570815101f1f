"""Model families, chosen from config.json's model_type."""

from __future__ import annotations

from ..attention import AttentionBackend, AttnShape
from ..config import ModelSpec
from ..errors import ModelLoadError
from .base import EmbeddingModel, StepInputs
from .bert import BertEmbedder
from .deberta_v2 import DebertaV2CrossEncoder
from .gemma3 import Gemma3Embedder
from .modernbert import ModernBertCrossEncoder, ModernBertEmbedder
from .mpnet import MPNetEmbedder
from .nomic_bert import NomicBertEmbedder
from .null import NullModel
from .qwen3 import Qwen3Embedder, Qwen3Reranker
from .rerank import CrossEncoder
from .splade import SpladeEncoder

__all__ = ["EmbeddingModel", "StepInputs", "attn_shape", "build_model"]

ENCODERS = ("bert", "xlm-roberta")


def attn_shape(spec: ModelSpec) -> AttnShape:
    """The attention shape of a model, known before building it."""
    cfg = spec.hf_config
    heads = int(cfg.get("num_attention_heads", 1))
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    return AttnShape(heads, kv, head_dim, causal=spec.causal)


def build_model(spec: ModelSpec, backend: AttentionBackend) -> EmbeddingModel:
    """An unloaded model, built on the CPU in float32 (the engine loads the
    weights, then moves it to its device and dtype)."""
    if spec.model_type == "null":
        return NullModel(spec)
    if spec.pipeline is not None and spec.pipeline.splade is not None:
        return SpladeEncoder(spec, backend)
    if spec.model_type in ENCODERS:
        return CrossEncoder(spec, backend) if spec.is_cross_encoder else BertEmbedder(spec, backend)
    if spec.model_type == "deberta-v2" and spec.is_cross_encoder:
        return DebertaV2CrossEncoder(spec, backend)
    if spec.model_type == "mpnet" and not spec.is_cross_encoder:
        return MPNetEmbedder(spec, backend)
    if spec.model_type == "modernbert":
        return ModernBertCrossEncoder(spec, backend) if spec.is_cross_encoder else ModernBertEmbedder(spec, backend)
    if spec.model_type == "gemma3-text" and not spec.is_cross_encoder:
        return Gemma3Embedder(spec, backend)
    if spec.model_type == "nomic-bert" and not spec.is_cross_encoder:
        return NomicBertEmbedder(spec, backend)
    if spec.model_type == "qwen3" and (spec.score_tokens or not spec.is_cross_encoder):
        return Qwen3Reranker(spec, backend) if spec.score_tokens else Qwen3Embedder(spec, backend)
    raise ModelLoadError(
        f"model type {spec.model_type!r}"
        f"{' (cross-encoder)' if spec.is_cross_encoder else ''} is not supported "
        f"(supported: bert, xlm-roberta, modernbert embedders and cross-encoders; deberta-v2 cross-encoders; mpnet, modernbert, gemma3-text, nomic-bert and qwen3 embedders; qwen3 causal-LM rerankers)"
    )
