"""Cross-encoders: BERT (``BertForSequenceClassification``) and XLM-RoBERTa
(``XLMRobertaForSequenceClassification``). With one label, a reranker: one
score per (query, document) sequence, the raw logit and its sigmoid. With
several (``id2label``), a classifier: one raw logit per label."""

from __future__ import annotations

import torch

from ..attention import AttentionBackend
from ..config import ModelSpec
from ..errors import ModelLoadError
from ..interface import OutputKind
from ..loader import WeightReader
from .base import EmbeddingModel, StepInputs
from .bert import BertEncoder, padding_idx
from .heads import ClassifierHead
from .layers import segment_cumsum


def second_segment(token_ids: torch.Tensor, sep_id: int, cu_seqlens: torch.Tensor,
                   seg_ids: torch.Tensor) -> torch.Tensor:
    """BERT token types for ``[CLS] A [SEP] B [SEP]``: 1 for every token
    after a sequence's first separator, else 0. Computed on the device."""
    is_sep = (token_ids == sep_id).long()
    seps_before = segment_cumsum(is_sep, cu_seqlens, seg_ids) - is_sep
    return (seps_before > 0).long()


class CrossEncoder(EmbeddingModel):
    """A BERT-family encoder with a classification head."""

    pooling = "none"

    def __init__(self, spec: ModelSpec, backend: AttentionBackend):
        super().__init__()
        cfg = spec.hf_config
        labels = len(spec.labels)
        self.kinds = tuple(spec.kinds())
        self.encoder = BertEncoder(cfg, backend, padding_idx(spec))
        self.classifier = ClassifierHead(spec.hidden_size, labels)
        self.family = spec.model_type
        self.dimension = labels
        self.sep_id = None
        if int(cfg.get("type_vocab_size", 1)) > 1:
            self.sep_id = spec.token_id("sep_token")
            if self.sep_id is None:
                raise ModelLoadError(f"{spec.path}: cannot find the separator token to mark the pair's second segment")

    def encode(self, x: StepInputs) -> torch.Tensor:
        types = None
        if self.sep_id is not None:
            types = second_segment(x.token_ids, self.sep_id, x.cu_seqlens, x.seg_ids)
        return self.encoder(x, types)

    def head(self, kind: OutputKind, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        if kind in self.kinds:
            logits = self.classifier(hidden, x)
            return torch.cat([logits, torch.sigmoid(logits)], dim=1) if kind is OutputKind.SCORE else logits
        return super().head(kind, hidden, x)

    def load(self, w: WeightReader) -> None:
        self.encoder.load(w)
        if self.family == "bert":
            self.classifier.load(w, "pooler.dense", "classifier")
        else:
            self.classifier.load(w, "classifier.dense", "classifier.out_proj")
