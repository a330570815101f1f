"""In-process baselines: ``sentence-transformers`` ``encode`` (tokenization
included) and a bare ``transformers`` forward on prepared token ids."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch


class SentenceTransformersBaseline:
    """``SentenceTransformer(model_dir).encode`` as its users call it."""

    def __init__(self, model_dir: str):
        from sentence_transformers import SentenceTransformer

        self.model = SentenceTransformer(model_dir, device="cpu")
        self.max_length = int(self.model.max_seq_length)

    def encode(self, texts: list[str] | str, batch_size: int = 32) -> np.ndarray:
        return self.model.encode(texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False)


def _pooling(model_dir: str) -> str:
    cfg = Path(model_dir) / "1_Pooling" / "config.json"
    if not cfg.is_file():
        return "cls"
    c = json.loads(cfg.read_text())
    if c.get("pooling_mode_mean_tokens"):
        return "mean"
    if c.get("pooling_mode_lasttoken"):
        return "last"
    return "cls"


class BareForward:
    """``AutoModel`` forward plus the model's pooling and L2 normalisation,
    on token ids prepared (padded, with a mask) before timing starts."""

    def __init__(self, model_dir: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
        from transformers import AutoModel

        self.model = AutoModel.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        self.pooling = _pooling(model_dir)
        self.device = device

    def prepare(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        n, longest = len(sequences), max(len(s) for s in sequences)
        ids = torch.zeros(n, longest, dtype=torch.long)
        mask = torch.zeros(n, longest, dtype=torch.long)
        for i, s in enumerate(sequences):
            ids[i, : len(s)] = torch.tensor(s)
            mask[i, : len(s)] = 1
        return ids.to(self.device), mask.to(self.device)

    @torch.inference_mode()
    def forward(self, prepared: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        ids, mask = prepared
        hidden = self.model(input_ids=ids, attention_mask=mask).last_hidden_state
        if self.pooling == "mean":
            m = mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * m).sum(1) / m.sum(1)
        elif self.pooling == "last":
            pooled = hidden[torch.arange(ids.shape[0]), mask.sum(1) - 1]
        else:
            pooled = hidden[:, 0]
        return torch.nn.functional.normalize(pooled.float(), dim=-1)

    def embed(self, sequences: list[list[int]]) -> np.ndarray:
        return self.forward(self.prepare(sequences)).cpu().numpy()
