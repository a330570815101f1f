"""A LoRA adapter in PEFT's format, read and checked without a model: a
directory with ``adapter_config.json`` and ``adapter_model.safetensors``
(or ``adapter_model.bin``), as ``PeftModel.save_pretrained`` writes it.

ROSE applies plain LoRA, ``y += scale * (x @ A^T) @ B^T`` on linear
projections, with PEFT's scale (``lora_alpha / r``, or ``/ sqrt(r)`` with
``use_rslora``; ``rank_pattern`` and ``alpha_pattern`` per module). What
an adapter sets beyond that would change its outputs, so it is refused
here, each with its own message, rather than served differently from how
it was trained.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import AdapterError, ModelLoadError
from ..loader import read_file

CONFIG = "adapter_config.json"
WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")

# Options that do not change what a trained adapter computes (how it was
# initialised, trained or described), or that are read below.
_INERT = frozenset((
    "peft_type", "task_type", "inference_mode", "base_model_name_or_path", "revision", "peft_version",
    "auto_mapping", "r", "lora_alpha", "lora_dropout", "target_modules", "exclude_modules", "layers_to_transform",
    "layers_pattern", "rank_pattern", "alpha_pattern", "use_rslora", "init_lora_weights", "loftq_config",
    "eva_config", "corda_config", "lora_ga_config", "qalora_group_size", "megatron_core", "ensure_weight_tying",
))
# Options with a message of their own when set.
_REFUSED = {
    "use_dora": "DoRA (use_dora) rescales each base weight column by a trained magnitude, which ROSE does not apply",
    "lora_bias": "trained LoRA biases (lora_bias) are not applied by ROSE",
    "fan_in_fan_out": "fan_in_fan_out (GPT-2 style Conv1D weights) is not supported",
    "modules_to_save": "modules_to_save replaces whole modules of the base model, which ROSE does not load",
    "trainable_token_indices": "trained token embeddings (trainable_token_indices) are not supported",
    "target_parameters": "LoRA on parameters (target_parameters) is not supported, only on linear modules",
    "layer_replication": "layer_replication changes the base model's layers, which ROSE does not do",
    "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens) is not supported",
    "use_qalora": "QA-LoRA (use_qalora) is not supported",
}
# A weight key: the module's name in the base model, then which matrix.
_KEY = re.compile(r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<which>[AB])\.weight$")


@dataclass(frozen=True)
class Matrices:
    """One adapted module: ``a`` [r, in], ``b`` [out, r] (float32, CPU)
    and its scale."""

    a: torch.Tensor
    b: torch.Tensor
    scale: float

    @property
    def rank(self) -> int:
        return int(self.a.shape[0])


@dataclass(frozen=True)
class PeftLora:
    """An adapter as PEFT saved it: its matrices by module name (the base
    model's, e.g. ``encoder.layer.0.attention.self.query``)."""

    path: Path
    modules: dict[str, Matrices]
    alpha: float
    rslora: bool
    base: str  # base_model_name_or_path, "" when unset

    @property
    def rank(self) -> int:
        return max((m.rank for m in self.modules.values()), default=0)


def read_peft(path: str | Path) -> PeftLora:
    """The adapter in directory ``path``; ``AdapterError`` naming what is
    wrong or not supported."""
    path = Path(path)
    cfg_file = path / CONFIG
    if not cfg_file.is_file():
        raise AdapterError(f"{path}: no {CONFIG} (a PEFT LoRA adapter directory has {CONFIG} and {WEIGHTS[0]})")
    try:
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise AdapterError(f"{cfg_file}: {e}") from e
    if not isinstance(cfg, dict):
        raise AdapterError(f"{cfg_file}: not a JSON object")
    _check_config(cfg, cfg_file)
    tensors = _read_weights(path)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        m = _KEY.match(key)
        if m is None:
            raise AdapterError(f"{path}: adapter weight {key!r} {_not_lora(key)}")
        pairs.setdefault(m["module"], {})[m["which"]] = t
    if not pairs:
        raise AdapterError(f"{path}: the adapter has no LoRA weights")
    r, alpha = int(_positive(cfg, "r", cfg_file)), _positive(cfg, "lora_alpha", cfg_file)
    rslora = bool(cfg.get("use_rslora"))
    ranks, alphas = dict(cfg.get("rank_pattern") or {}), dict(cfg.get("alpha_pattern") or {})
    modules = {}
    for name, ab in sorted(pairs.items()):
        if set(ab) != {"A", "B"}:
            raise AdapterError(f"{path}: module {name} has lora_{''.join(ab)} but not both lora_A and lora_B")
        a, b = ab["A"], ab["B"]
        if a.dim() != 2 or b.dim() != 2 or a.shape[0] != b.shape[1]:
            raise AdapterError(f"{path}: module {name}: lora_A {list(a.shape)} and lora_B {list(b.shape)} are not "
                               "[r, in] and [out, r]")
        want = int(ranks[_pattern(ranks, name)]) if _pattern(ranks, name) else r
        if a.shape[0] != want:
            raise AdapterError(f"{path}: module {name} has rank {a.shape[0]}, adapter_config.json says {want}")
        a_mod = float(alphas[_pattern(alphas, name)]) if _pattern(alphas, name) else alpha
        scale = a_mod / (math.sqrt(want) if rslora else want)
        modules[name] = Matrices(a.detach().float(), b.detach().float(), scale)
    return PeftLora(path, modules, alpha, rslora, str(cfg.get("base_model_name_or_path") or ""))


def _check_config(cfg: dict, where: Path) -> None:
    if str(cfg.get("peft_type", "")).upper() != "LORA":
        raise AdapterError(f"{where}: peft_type {cfg.get('peft_type')!r} is not LORA; ROSE serves LoRA adapters only")
    bias = cfg.get("bias", "none")
    if bias not in (None, "none"):
        raise AdapterError(f"{where}: bias={bias!r}: trained biases are not applied by ROSE (bias must be 'none')")
    for key, why in _REFUSED.items():
        if cfg.get(key):
            raise AdapterError(f"{where}: {why} ({key}={cfg[key]!r})")
    for key, value in cfg.items():
        if key not in _INERT and key not in _REFUSED and key != "bias" and value:
            raise AdapterError(f"{where}: sets {key}={value!r}, which ROSE does not apply (it applies plain LoRA: "
                               "r, lora_alpha, use_rslora, rank_pattern, alpha_pattern)")


def _positive(cfg: dict, key: str, where: Path) -> float:
    value = cfg.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool) or value <= 0 or (key == "r" and value % 1):
        raise AdapterError(f"{where}: {key} must be a positive {'integer' if key == 'r' else 'number'}, got {value!r}")
    return float(value)


def _pattern(patterns: dict, name: str) -> str | None:
    """The ``rank_pattern``/``alpha_pattern`` key that matches module
    ``name``, as PEFT matches them (``get_pattern_key``)."""
    return next((k for k in patterns if re.match(rf"(.*\.)?({k})$", name)), None)


def _read_weights(path: Path) -> dict[str, torch.Tensor]:
    for name in WEIGHTS:
        if (path / name).is_file():
            try:
                return read_file(path / name)
            except ModelLoadError as e:
                raise AdapterError(str(e)) from e
    raise AdapterError(f"{path}: no {' or '.join(WEIGHTS)}")


def _not_lora(key: str) -> str:
    """Why a weight key is not one of a plain LoRA's matrices."""
    if "lora_embedding_" in key:
        return "is an embedding adapter (LoRA on an embedding table), which ROSE does not apply"
    if "lora_magnitude_vector" in key:
        return "is a DoRA magnitude, which ROSE does not apply"
    if key.endswith(".bias"):
        return "is a trained bias, which ROSE does not apply"
    return "is not a LoRA matrix (<module>.lora_A.weight or <module>.lora_B.weight)"
