"""SPLADE sparse encoders (sentence-transformers' SparseEncoder: a
masked-LM Transformer + SpladePooling) on BERT and XLM-RoBERTa: the MLM
head's logits per token, ``log1p(relu(.))``, pooled per vocabulary entry
(max or sum) over each sequence. One row of vocabulary width per sequence
(``sparse_vocab``)."""

from __future__ import annotations

import torch
from torch import nn

from ..attention import AttentionBackend
from ..config import ModelSpec
from ..errors import ModelLoadError
from ..interface import OutputKind
from ..loader import WeightReader
from .base import EmbeddingModel, StepInputs
from .bert import BertEncoder, padding_idx
from .layers import activation, copy_linear, copy_norm

# Weight names of each family's masked-LM head: (transform dense, its
# norm, decoder, decoder bias).
_HEADS = {
    "bert": ("cls.predictions.transform.dense", "cls.predictions.transform.LayerNorm",
             "cls.predictions.decoder", "cls.predictions.bias"),
    "xlm-roberta": ("lm_head.dense", "lm_head.layer_norm", "lm_head.decoder", "lm_head.bias"),
}


class MaskedLMHead(nn.Module):
    """``decoder(norm(act(dense(h)))) + bias`` → [T, vocab] logits; the
    decoder is tied to the word embeddings unless the checkpoint has its own."""

    def __init__(self, cfg: dict, family: str):
        super().__init__()
        hidden, vocab = int(cfg["hidden_size"]), int(cfg["vocab_size"])
        eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.names = _HEADS[family]
        self.dense = nn.Linear(hidden, hidden)
        self.norm = nn.LayerNorm(hidden, eps=eps)
        self.act = activation(str(cfg.get("hidden_act", "gelu")))
        self.decoder = nn.Linear(hidden, vocab)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.norm(self.act(self.dense(h))))

    def load(self, w: WeightReader, tied: torch.Tensor) -> None:
        dense, norm, decoder, bias = self.names
        with torch.no_grad():
            copy_linear(self.dense, w, dense)
            copy_norm(self.norm, w, norm)
            name = f"{decoder}.weight"
            self.decoder.weight.copy_(w.take(name) if name in w else tied)
            self.decoder.bias.copy_(w.take(bias))
            if f"{decoder}.bias" in w:  # the same tensor saved twice
                w.take(f"{decoder}.bias")


class SpladeEncoder(EmbeddingModel):
    kinds = (OutputKind.SPARSE_VOCAB,)
    # Tokens per slice of the [tokens, vocabulary] logits: bounds the
    # memory of a large step (4096 x 30522 float32 is 0.5 GB); the slices
    # depend only on the token count, so a CUDA graph can hold the loop.
    chunk_tokens = 1024

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__()
        if spec.model_type not in _HEADS:
            raise ModelLoadError(f"SPLADE on {spec.model_type!r} is not supported (supported: {', '.join(_HEADS)})")
        self.encoder = BertEncoder(spec.hf_config, backend, padding_idx(spec))
        self.mlm = MaskedLMHead(spec.hf_config, spec.model_type)
        # build_model picks this class only for a pipeline with a SPLADE step.
        assert spec.pipeline is not None and spec.pipeline.splade is not None
        splade = spec.pipeline.splade
        self.strategy, self.twice = splade.strategy, splade.activation == "log1p_relu"
        self.dimension = spec.vocab_size

    def encode(self, x: StepInputs) -> torch.Tensor:
        return self.encoder(x)

    def head(self, kind: OutputKind, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        if kind is not OutputKind.SPARSE_VOCAB:
            return super().head(kind, hidden, x)
        n = x.cu_seqlens.numel() - 1
        out = torch.zeros(n, self.dimension, dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], self.chunk_tokens):
            h = hidden[start:start + self.chunk_tokens]
            seg = x.seg_ids[start:start + self.chunk_tokens]
            w = torch.log1p(torch.relu(self.mlm(h).float()))
            if self.twice:
                w = torch.log1p(w)
            if self.strategy == "sum":
                out.index_add_(0, seg, w)
            else:
                # Weights are >= 0, so a zero start is the same as -inf.
                out.scatter_reduce_(0, seg.long().unsqueeze(1).expand_as(w), w, reduce="amax")
        return out

    def load(self, w: WeightReader) -> None:
        self.encoder.load(w)
        self.mlm.load(w, self.encoder.word.weight.detach())
