"""Output heads beyond dense pooling: BGE-M3's sparse lexical weights and
multi-vector (ColBERT) vectors, and the cross-encoder classifier. Each
works on the flat token axis with shapes fixed by (T, n)."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ModelLoadError
from ..loader import WeightReader, read_file
from .base import StepInputs
from .layers import copy_linear, first_token_index, rows_after_first


def _read_linear_state(path: Path) -> dict[str, torch.Tensor]:
    """A ``Linear``'s state dict saved with ``torch.save`` (tensors only)."""
    state = read_file(path)
    if not isinstance(state, dict) or "weight" not in state:
        raise ModelLoadError(f"{path} is not a Linear layer's state dict (no 'weight')")
    return state


def _load_linear(m: nn.Linear, path: Path) -> None:
    state = _read_linear_state(path)
    if tuple(state["weight"].shape) != tuple(m.weight.shape):
        raise ModelLoadError(f"{path}: weight shape {tuple(state['weight'].shape)}, expected {tuple(m.weight.shape)}")
    with torch.no_grad():
        m.weight.copy_(state["weight"])
        if m.bias is not None:
            if "bias" not in state:
                raise ModelLoadError(f"{path} has no bias")
            m.bias.copy_(state["bias"])


class SparseHead(nn.Module):
    """One lexical weight per token: ``relu(linear(h))``, zero for the
    tokenizer's special tokens (as BGE-M3 drops CLS, EOS, PAD and UNK).
    Max-per-id folding happens in the host (Tulip's output stage)."""

    special: torch.Tensor  # a buffer

    def __init__(self, hidden: int, vocab_size: int, special_ids: list[int]):
        super().__init__()
        self.linear = nn.Linear(hidden, 1)
        special = torch.zeros(vocab_size, dtype=torch.bool)
        special[[i for i in special_ids if 0 <= i < vocab_size]] = True
        self.register_buffer("special", special, persistent=False)

    def forward(self, hidden: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        w = torch.relu(self.linear(hidden).float())
        return w.masked_fill(self.special[token_ids.long()].unsqueeze(1), 0.0)

    def load_file(self, path: Path) -> None:
        _load_linear(self.linear, path)


class ColbertHead(nn.Module):
    """``linear(h)`` for every token after each sequence's first, then
    L2-normalised (BGE-M3's ``colbert_linear``)."""

    def __init__(self, hidden: int, dimension: int):
        super().__init__()
        self.linear = nn.Linear(hidden, dimension)
        self.dimension = dimension

    @classmethod
    def from_file(cls, path: Path) -> "ColbertHead":
        """Sized from the file (its output width is the vector dimension)."""
        out, hidden = _read_linear_state(path)["weight"].shape
        return cls(int(hidden), int(out))

    def forward(self, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        n = x.cu_seqlens.numel() - 1
        rows = rows_after_first(hidden, x.positions, x.seg_ids, n)
        return F.normalize(self.linear(rows).float(), dim=-1)

    def load_file(self, path: Path) -> None:
        _load_linear(self.linear, path)


class ClassifierHead(nn.Module):
    """Sequence classification on the first token, ``out(act(dense(h)))``:
    BERT's pooler + classifier and XLM-R's classification head (tanh), and
    DeBERTa's ContextPooler + classifier (its ``pooler_hidden_act``) share
    this shape. Returns the raw logits [n, labels] in float32."""

    def __init__(self, hidden: int, labels: int = 1, act=torch.tanh):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, labels)
        self.act = act

    def forward(self, hidden: torch.Tensor, x: StepInputs) -> torch.Tensor:
        cls = hidden[first_token_index(x.cu_seqlens)]
        return self.out(self.act(self.dense(cls))).float()

    def load(self, w: WeightReader, dense: str, out: str) -> None:
        with torch.no_grad():
            copy_linear(self.dense, w, dense)
            copy_linear(self.out, w, out)
