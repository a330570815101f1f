"""A model that computes nothing: for measuring the serving path's own
overhead (HTTP, tokenization, gRPC, scheduling, the step call) in isolation.

Its directory needs only a config.json such as
``{"model_type": "null", "hidden_size": 384, "vocab_size": 30522,
"max_position_embeddings": 512}``; outputs are zeros of the right shape.
"""

from __future__ import annotations

import torch

from ..config import ModelSpec
from ..interface import OutputKind
from ..loader import WeightReader
from .base import EmbeddingModel, StepInputs


class NullModel(EmbeddingModel):
    kinds = (OutputKind.DENSE,)

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.dimension = spec.hidden_size
        # A parameter gives the module a device and dtype to follow.
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)

    def encode(self, x: StepInputs) -> torch.Tensor:
        """Zero hidden states: no compute."""
        return torch.zeros(x.token_ids.numel(), self.dimension, dtype=torch.float32, device=self.anchor.device)

    def forward(self, kind: OutputKind, x: StepInputs) -> torch.Tensor:
        n = x.cu_seqlens.numel() - 1
        return torch.zeros(n, self.dimension, dtype=torch.float32, device=self.anchor.device)

    def load(self, w: WeightReader) -> None:
        """No weights."""
