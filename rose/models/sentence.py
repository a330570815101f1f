"""The sentence-transformers pipeline after the transformer, as one module:
pooling (one mode, or several concatenated), then Dense projections and
intermediate normalisation in order. The final Normalize is not here: it
is the engine's per-request ``normalize`` default."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelLoadError
from ..loader import read_weights
from ..pooling import pool
from ..st_modules import DenseStep, Pipeline
from .base import StepInputs

_ACTIVATIONS = {
    "tanh": torch.tanh,
    "identity": lambda x: x,
    "relu": F.relu,
    "gelu": F.gelu,
    "sigmoid": torch.sigmoid,
    "silu": F.silu,
}


class DenseLayer(nn.Module):
    """``activation(linear(x))``, computed in float32 whatever the model's
    dtype (it is one small matmul per sequence)."""

    def __init__(self, step: DenseStep):
        super().__init__()
        self.step = step
        self.linear = nn.Linear(step.in_features, step.out_features, bias=step.bias)
        # forward() casts it to float32.
        self.linear.weight_read_directly = True  # type: ignore[assignment]  # a flag; setattr is typed for tensors
        self.act = _ACTIVATIONS[step.activation]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bias = self.linear.bias.float() if self.linear.bias is not None else None
        return self.act(F.linear(x, self.linear.weight.float(), bias))

    def load_file(self) -> None:
        try:
            state = read_weights(self.step.path)
        except ModelLoadError as e:
            raise ModelLoadError(f"Dense module: {e}") from e
        for name, p in self.linear.named_parameters():
            key = f"linear.{name}"
            if key not in state:
                raise ModelLoadError(f"Dense module {self.step.path}: missing weight {key!r}")
            if tuple(state[key].shape) != tuple(p.shape):
                raise ModelLoadError(
                    f"Dense module {self.step.path}: {key} has shape {tuple(state[key].shape)}, expected {tuple(p.shape)}"
                )
            with torch.no_grad():
                p.copy_(state[key])


class SentenceHead(nn.Module):
    """Hidden states [T, H] → sentence vectors [n, D] (float32)."""

    def __init__(self, pipeline: Pipeline, hidden: int):
        super().__init__()
        self.modes = pipeline.pooling
        self.dimension = pipeline.dimension(hidden)
        self.steps = nn.ModuleList(DenseLayer(s) if isinstance(s, DenseStep) else _Normalize()
                                   for s in pipeline.steps)

    def forward(self, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        parts = [pool(hidden, m, x.cu_seqlens, x.seg_ids, x.inv_lengths, x.positions) for m in self.modes]
        out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)
        for step in self.steps:
            out = step(out)
        return out

    def load_files(self) -> None:
        for step in self.steps:
            if isinstance(step, DenseLayer):
                step.load_file()


class _Normalize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.normalize(x, dim=-1)

