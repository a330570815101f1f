"""What a Hugging Face model directory says about the model: architecture,
pooling, normalisation, maximum input length. Decided here, once."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ModelLoadError
from .interface import OutputKind

# Pooling modes in sentence-transformers' Pooling config, in its own order.
_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_lasttoken": "last",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_weightedmean_tokens": "weightedmean",
}
SUPPORTED_POOLING = ("cls", "mean", "last")


def _read_json(path: Path) -> dict[str, Any] | list[Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: {e}") from e


@dataclass
class ModelSpec:
    """The parsed contents of a model directory."""

    path: Path
    model_type: str  # config.json's model_type: "bert", "xlm-roberta", "qwen3", ...
    hf_config: dict[str, Any]
    pooling: str  # "cls" | "mean" | "last" | "none" (cross-encoders)
    normalize: bool  # the model's own pipeline normalises dense outputs
    max_length: int  # longest input, special tokens included
    is_cross_encoder: bool
    model_id: str
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def hidden_size(self) -> int:
        return int(self.hf_config["hidden_size"])

    @property
    def vocab_size(self) -> int:
        return int(self.hf_config["vocab_size"])

    def kinds(self) -> list[OutputKind]:
        if self.is_cross_encoder:
            return [OutputKind.SCORE]
        return [OutputKind.DENSE]

    @classmethod
    def from_dir(cls, path: str | Path, model_id: str | None = None) -> "ModelSpec":
        path = Path(path)
        if not path.is_dir():
            raise ModelLoadError(f"model directory {path} does not exist")
        hf = _read_json(path / "config.json")
        if not isinstance(hf, dict):
            raise ModelLoadError(f"{path} has no config.json")
        model_type = str(hf.get("model_type", "")).replace("_", "-")
        archs = hf.get("architectures") or []
        is_cross = any(a.endswith("ForSequenceClassification") for a in archs)
        pooling, normalize = _pipeline(path, model_type, is_cross)
        return cls(
            path=path,
            model_type=model_type,
            hf_config=hf,
            pooling=pooling,
            normalize=normalize,
            max_length=_max_length(path, hf, model_type),
            is_cross_encoder=is_cross,
            model_id=model_id or path.name,
        )


def _pipeline(path: Path, model_type: str, is_cross: bool) -> tuple[str, bool]:
    """Pooling and normalisation from sentence-transformers' modules.json."""
    if is_cross or model_type == "null":
        return "none", False
    modules = _read_json(path / "modules.json")
    if not isinstance(modules, list):
        # No sentence-transformers config: decoders pool the last token,
        # encoders the CLS token, as their own model cards do.
        return ("last" if model_type.startswith("qwen") else "cls"), True
    pooling = None
    normalize = False
    for m in modules:
        kind = str(m.get("type", ""))
        if kind.endswith("Pooling"):
            cfg = _read_json(path / m.get("path", "") / "config.json") or {}
            modes = [name for key, name in _POOLING_KEYS.items() if cfg.get(key)]
            if cfg.get("pooling_mode") in _POOLING_KEYS.values():
                modes = [cfg["pooling_mode"]]
            if len(modes) != 1 or modes[0] not in SUPPORTED_POOLING:
                raise ModelLoadError(
                    f"{path}: pooling {modes or 'none'} is not supported "
                    f"(supported: one of {', '.join(SUPPORTED_POOLING)})"
                )
            pooling = modes[0]
        elif kind.endswith("Normalize"):
            normalize = True
    if pooling is None:
        raise ModelLoadError(f"{path}: modules.json has no Pooling module")
    return pooling, normalize


def _max_length(path: Path, hf: dict[str, Any], model_type: str) -> int:
    """sentence-transformers' max_seq_length, else the tokenizer's
    model_max_length, capped by what the position table holds."""
    positions = int(hf.get("max_position_embeddings", 1 << 30))
    if model_type in ("xlm-roberta", "roberta"):
        # Positions start after the padding index (padding_idx + 1).
        positions -= int(hf.get("pad_token_id", 1)) + 1
    st = _read_json(path / "sentence_bert_config.json") or {}
    tok = _read_json(path / "tokenizer_config.json") or {}
    for candidate in (st.get("max_seq_length"), tok.get("model_max_length")):
        if isinstance(candidate, (int, float)) and 0 < candidate < 1e6:
            return min(int(candidate), positions)
    return positions
