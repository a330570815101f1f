"""Model families, chosen from config.json's model_type; what is not
supported is refused in one line naming its architecture."""

from __future__ import annotations

from collections.abc import Callable

from ..attention import AttentionBackend, AttnShape
from ..config import ModelSpec
from ..errors import ModelLoadError
from .base import EmbeddingModel, ImageInput, StepInputs
from .bert import BertEmbedder
from .clip import DualEncoder
from .clip import attn_shapes as dual_attn_shapes
from .deberta_v2 import DebertaV2CrossEncoder
from .gemma3 import Gemma3Embedder
from .modernbert import ModernBertCrossEncoder, ModernBertEmbedder
from .mpnet import MPNetEmbedder
from .nomic_bert import NomicBertEmbedder
from .null import NullModel
from .qwen3 import Qwen3Embedder, Qwen3Reranker
from .rerank import CrossEncoder
from .splade import SpladeEncoder

__all__ = ["EmbeddingModel", "ImageInput", "StepInputs", "attn_shape", "build_model", "check_supported",
           "config_refusal"]

ENCODERS = ("bert", "xlm-roberta")


def attn_shape(spec: ModelSpec) -> AttnShape:
    """The attention shape of a model, known before building it (a dual
    encoder's text tower's: the engine's backend plans its text steps)."""
    if spec.vision_config is not None:
        return dual_attn_shapes(spec.hf_config)[0]
    cfg = spec.hf_config
    heads = int(cfg.get("num_attention_heads", 1))
    kv = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    return AttnShape(heads, kv, head_dim, causal=spec.causal)


# What a server serves, for the refusal of everything else.
SUPPORTED = ("bert, xlm-roberta and modernbert embedders and cross-encoders; deberta-v2 cross-encoders; mpnet, "
             "gemma3-text, nomic-bert and qwen3 embedders; qwen3 causal-LM rerankers; SPLADE on bert and xlm-roberta; "
             "clip and siglip image and text embedders")
MODEL_TYPES = ("bert", "xlm-roberta", "deberta-v2", "mpnet", "modernbert", "gemma3-text", "nomic-bert", "qwen3", "clip",
               "siglip", "null")


def describe(config: dict) -> str:
    """A model's architecture as its config.json names it: the
    ``architectures``, the ``model_type`` and any nested configs (CLIP's
    ``text_config`` and ``vision_config``)."""
    archs = [str(a) for a in config.get("architectures") or []]
    nested = sorted(k for k, v in config.items() if k.endswith("_config") and isinstance(v, dict))
    inner = [f"model_type {str(config.get('model_type', '')) or 'missing'!r}"]
    if nested:
        inner.append(f"nested {', '.join(nested)}")
    return f"{', '.join(archs) or 'no architectures'} ({'; '.join(inner)})"


def config_refusal(config: dict) -> str | None:
    """Why ROSE cannot serve a model, from its config.json alone (before
    its weights are fetched or read), or None when it may."""
    model_type = str(config.get("model_type", "")).replace("_", "-")
    if model_type in MODEL_TYPES:
        return None
    return f"{describe(config)} is not supported; ROSE serves {SUPPORTED}"


def check_supported(spec: ModelSpec) -> None:
    """Raises ModelLoadError, in one line naming the architecture and what
    is supported, when ``build_model`` has no family for ``spec``."""
    why = config_refusal(spec.hf_config)
    if why is None and _family(spec) is None:
        why = (f"{describe(spec.hf_config)}{' as a cross-encoder' if spec.is_cross_encoder else ''} "
               f"is not supported; ROSE serves {SUPPORTED}")
    if why is not None:
        raise ModelLoadError(f"{spec.path}: {why}")


def _family(spec: ModelSpec) -> Callable[[ModelSpec, AttentionBackend], EmbeddingModel] | None:
    """The model class that serves ``spec``, or None."""
    if spec.model_type == "null":
        return lambda s, _: NullModel(s)
    if spec.model_type in ("clip", "siglip") and not spec.is_cross_encoder:
        return DualEncoder
    if spec.pipeline is not None and spec.pipeline.splade is not None:
        return SpladeEncoder
    if spec.model_type in ENCODERS:
        return CrossEncoder if spec.is_cross_encoder else BertEmbedder
    if spec.model_type == "deberta-v2" and spec.is_cross_encoder:
        return DebertaV2CrossEncoder
    if spec.model_type == "mpnet" and not spec.is_cross_encoder:
        return MPNetEmbedder
    if spec.model_type == "modernbert":
        return ModernBertCrossEncoder if spec.is_cross_encoder else ModernBertEmbedder
    if spec.model_type == "gemma3-text" and not spec.is_cross_encoder:
        return Gemma3Embedder
    if spec.model_type == "nomic-bert" and not spec.is_cross_encoder:
        return NomicBertEmbedder
    if spec.model_type == "qwen3" and (spec.score_tokens or not spec.is_cross_encoder):
        return Qwen3Reranker if spec.score_tokens else Qwen3Embedder
    return None


def build_model(spec: ModelSpec, backend: AttentionBackend) -> EmbeddingModel:
    """An unloaded model, built on the CPU in float32 (the engine loads the
    weights, then moves it to its device and dtype)."""
    check_supported(spec)
    family = _family(spec)
    assert family is not None  # check_supported refused every other spec
    return family(spec, backend)
