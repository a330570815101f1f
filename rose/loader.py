"""Reading weights, the one place that opens weight files: a Hugging Face
model directory (the transformer, a sentence-transformers Dense module) in
safetensors, or PyTorch ``.bin`` files when it has no safetensors, and
single files saved with ``torch.save`` (BGE-M3's heads)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from .errors import ModelLoadError

# Prefixes that task wrappers put in front of the base model's names.
_PREFIXES = ("bert.", "roberta.", "mpnet.", "deberta.", "model.", "encoder_model.")


def read_weights(path: Path) -> dict[str, torch.Tensor]:
    """All tensors of the model (single file or sharded), on the CPU:
    safetensors when the directory has them, else ``pytorch_model.bin``
    (loaded with ``weights_only``, so no code in it runs)."""
    path = Path(path)
    for single, index in (("model.safetensors", "model.safetensors.index.json"),
                          ("pytorch_model.bin", "pytorch_model.bin.index.json")):
        if (path / index).is_file():
            try:
                files = sorted(set(json.loads((path / index).read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError) as e:
                raise ModelLoadError(f"{path / index}: {e}") from e
            return _read_files(path, files)
        if (path / single).is_file():
            return _read_files(path, [single])
    raise ModelLoadError(f"{path} has no weights: neither model.safetensors nor pytorch_model.bin (nor an index of "
                         "either)")


def read_file(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of one file on the CPU: safetensors by its suffix, any
    other with ``torch.load(weights_only=True)``, so no code in it runs."""
    path = Path(path)
    try:
        if path.name.endswith(".safetensors"):
            return load_file(str(path), device="cpu")
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # safetensors and torch raise several unrelated types
        raise ModelLoadError(f"cannot read {path}: {e}") from e


def _read_files(path: Path, files: list[str]) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for f in files:
        tensors.update(read_file(path / f))
    return tensors


def strip_prefix(tensors: dict[str, torch.Tensor], keep: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
    """Drops a task wrapper's prefix ("bert.", "roberta.", "model.") from
    names, except names starting with one of ``keep`` (e.g. heads)."""
    out = {}
    for name, t in tensors.items():
        if not name.startswith(keep):
            for p in _PREFIXES:
                if name.startswith(p):
                    name = name[len(p):]
                    break
        out[name] = t
    return out


class WeightReader:
    """Hands out tensors by name and reports what was left unused."""

    def __init__(self, tensors: dict[str, torch.Tensor], source: str):
        self._tensors = tensors
        self._used: set[str] = set()
        self.source = source

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def take(self, name: str) -> torch.Tensor:
        try:
            t = self._tensors[name]
        except KeyError:
            raise ModelLoadError(f"{self.source}: missing weight {name!r}") from None
        self._used.add(name)
        return t

    def unused(self, ignore: tuple[str, ...] = ()) -> list[str]:
        return sorted(n for n in self._tensors if n not in self._used and not n.startswith(ignore) and not any(i in n for i in ignore))
