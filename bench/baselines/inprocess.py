"""In-process baselines: ``sentence-transformers`` ``encode`` (tokenization
included), a bare ``transformers`` forward on prepared token ids, and
fastembed's runtime (ONNX Runtime + ``tokenizers``)."""

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


def padded(sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids padded to the longest (with 0: the mask hides it) and the
    attention mask, as ``transformers`` and its ONNX export take them."""
    n, longest = len(sequences), max(len(s) for s in sequences)
    ids = torch.zeros(n, longest, dtype=torch.long)
    mask = torch.zeros(n, longest, dtype=torch.long)
    for i, s in enumerate(sequences):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    return ids, mask


class BareForward:
    """``AutoModel`` forward plus the model's pooling and L2 normalisation,
    on token ids prepared (padded, with a mask) before timing starts."""

    def __init__(self, model_dir: str, dtype: torch.dtype = torch.float32, device: str = "cpu"):
        from transformers import AutoModel

        self.model = AutoModel.from_pretrained(model_dir, dtype=dtype).to(device).eval()
        self.pooling = _pooling(model_dir)
        self.device = device

    def prepare(self, sequences: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = padded(sequences)
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


class OnnxRuntimeBaseline:
    """fastembed's runtime, in-process: ONNX Runtime on the model exported
    to ONNX from ``transformers`` on the same weights (at load, into
    ``work_dir``; nothing downloaded), Hugging Face ``tokenizers`` with
    truncation and padding, then the model's pooling (mean over the mask,
    CLS or last token) and L2 normalisation in NumPy, as fastembed does.
    Intra-op threads are the run's thread budget; its threads spin while
    waiting only when ``OMP_WAIT_POLICY`` is not ``PASSIVE`` (the harness
    sets PASSIVE for every side: a spinning side steals the cores from the
    next side of an interleaved round)."""

    def __init__(self, model_dir: str, threads: int, max_length: int, work_dir: Path):
        import os

        import onnxruntime as ort
        from tokenizers import Tokenizer
        from transformers import AutoModel

        self.pooling = _pooling(model_dir)
        path = Path(work_dir) / "model.onnx"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            model = AutoModel.from_pretrained(model_dir, dtype=torch.float32).eval()
            ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
            batch, length = torch.export.Dim("batch", min=1, max=4096), torch.export.Dim("length", min=2, max=8192)
            dyn = {"input_ids": {0: batch, 1: length}, "attention_mask": {0: batch, 1: length}}
            from rose.cpu.onnx_export import quiet_exporter

            with torch.no_grad(), quiet_exporter():
                torch.onnx.export(_LastHidden(model), (ids, torch.ones_like(ids)), str(path), dynamo=True,
                                  dynamic_shapes=dyn, input_names=list(dyn), output_names=["last_hidden_state"],
                                  optimize=True, verbose=False)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = threads
        opts.inter_op_num_threads = 1
        passive = os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0" if passive else "1")
        self.session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
        self.tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length)
        pad = self.tokenizer.padding or {}
        self.tokenizer.enable_padding(pad_id=pad.get("pad_id", 0), pad_token=pad.get("pad_token", "[PAD]"))

    def encode(self, texts: list[str] | str) -> np.ndarray:
        enc = self.tokenizer.encode_batch([texts] if isinstance(texts, str) else texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
        hidden = self.session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        if self.pooling == "mean":
            m = mask[..., None].astype(np.float32)
            pooled = (hidden * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        elif self.pooling == "last":
            pooled = hidden[np.arange(len(ids)), mask.sum(1) - 1]
        else:
            pooled = hidden[:, 0]
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)


class _LastHidden(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
