"""The sentence-transformers module pipeline of a model directory, read
once: pooling modes, Dense projections, Normalize, and the model's own
prompts. Every module in ``modules.json`` is either understood here or a
load error that names it: a skipped module would serve wrong vectors.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import ModelLoadError

# sentence-transformers' pooling modes in its concatenation order (the
# order of its legacy ``pooling_mode_*`` keys), mapped to ROSE's names.
POOLING_MODES = {
    "cls": "cls",
    "max": "max",
    "mean": "mean",
    "mean_sqrt_len_tokens": "mean_sqrt_len",
    "weightedmean": "weightedmean",
    "lasttoken": "last",
}
_LEGACY_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
# Dense activations by the class name sentence-transformers saves.
ACTIVATIONS = {
    "torch.nn.modules.activation.Tanh": "tanh",
    "torch.nn.modules.linear.Identity": "identity",
    "torch.nn.modules.activation.ReLU": "relu",
    "torch.nn.modules.activation.GELU": "gelu",
    "torch.nn.modules.activation.Sigmoid": "sigmoid",
    "torch.nn.modules.activation.SiLU": "silu",
}
# Modules that change nothing at inference.
_NO_OPS = ("Dropout",)


@dataclass(frozen=True)
class DenseStep:
    """A sentence-transformers ``Dense``: ``activation(linear(x))``."""

    path: Path  # the module's folder (config.json + weights)
    in_features: int
    out_features: int
    bias: bool
    activation: str  # a value of ACTIVATIONS


@dataclass(frozen=True)
class NormalizeStep:
    """L2 normalisation in the middle of the pipeline (a final one is the
    ``normalize`` default instead, which a request may turn off)."""


@dataclass(frozen=True)
class SpladeStep:
    """sentence-transformers' ``SpladePooling`` over masked-LM logits:
    ``log1p(relu(logits))`` (twice log1p for "log1p_relu"), then max or sum
    over the sequence's tokens: one weight per vocabulary entry."""

    strategy: str  # "max" | "sum"
    activation: str  # "relu" | "log1p_relu"


@dataclass(frozen=True)
class Pipeline:
    """What turns hidden states into a sentence vector."""

    pooling: tuple[str, ...]  # ROSE names, concatenated in this order
    steps: tuple[DenseStep | NormalizeStep, ...] = ()
    normalize: bool = False  # the pipeline ends with Normalize
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    splade: SpladeStep | None = None  # a SparseEncoder: masked-LM logits pooled per vocabulary entry

    @property
    def pooling_name(self) -> str:
        if self.splade is not None:
            return f"splade_{self.splade.strategy}"
        return "+".join(self.pooling)

    def dimension(self, hidden: int) -> int:
        """The output width for a model of ``hidden`` width; checks that
        each Dense takes the width it is given."""
        dim = hidden * len(self.pooling)
        for s in self.steps:
            if isinstance(s, DenseStep):
                if s.in_features != dim:
                    raise ModelLoadError(f"Dense module {s.path}: in_features {s.in_features}, but its input has {dim}")
                dim = s.out_features
        return dim


def read_json(path: Path) -> Any:
    """A JSON file's content, None when the file is missing."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: {e}") from e


def read_prompts(path: Path) -> tuple[dict[str, str], str | None]:
    """``prompts`` and ``default_prompt_name`` of
    config_sentence_transformers.json (empty when absent)."""
    cfg = read_json(path / "config_sentence_transformers.json") or {}
    prompts = cfg.get("prompts") or {}
    if not isinstance(prompts, dict) or not all(isinstance(v, str) for v in prompts.values()):
        raise ModelLoadError(f"{path / 'config_sentence_transformers.json'}: prompts must map names to strings")
    default = cfg.get("default_prompt_name") or None
    if default is not None and default not in prompts:
        raise ModelLoadError(
            f"{path / 'config_sentence_transformers.json'}: default_prompt_name {default!r} is not one of its "
            f"prompts ({', '.join(prompts) or 'none'})"
        )
    return {str(k): v for k, v in prompts.items()}, default


def pooling_modes(cfg: dict[str, Any], where: Path) -> tuple[str, ...]:
    """ROSE pooling names from a Pooling config, new (``pooling_mode``) or
    legacy (``pooling_mode_*_token(s)`` flags) style, as
    sentence-transformers reads it (no mode at all means mean)."""
    if cfg.get("include_prompt") is False:
        raise ModelLoadError(
            f"{where}: Pooling with include_prompt=false (prompt tokens left out of pooling) is not supported"
        )
    mode = cfg.get("pooling_mode")
    if mode is None:
        modes = [m for k, m in _LEGACY_KEYS.items() if cfg.get(k)] or ["mean"]
    else:
        modes = [mode] if isinstance(mode, str) else list(mode)
    unknown = [m for m in modes if m not in POOLING_MODES]
    if unknown or not modes:
        raise ModelLoadError(
            f"{where}: pooling mode {unknown or modes} is not supported (supported: {', '.join(POOLING_MODES)})"
        )
    return tuple(POOLING_MODES[m] for m in modes)


def _splade(cfg: dict[str, Any], folder: Path) -> SpladeStep:
    strategy = cfg.get("pooling_strategy", "max")
    act = cfg.get("activation_function", "relu")
    if strategy not in ("max", "sum") or act not in ("relu", "log1p_relu"):
        raise ModelLoadError(f"SpladePooling {folder}: pooling_strategy {strategy!r} / activation_function {act!r} "
                             "is not supported (max or sum; relu or log1p_relu)")
    return SpladeStep(strategy, act)


def _dense(folder: Path) -> DenseStep:
    cfg = read_json(folder / "config.json")
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"Dense module {folder} has no config.json")
    act = str(cfg.get("activation_function", "torch.nn.modules.activation.Tanh"))
    if act not in ACTIVATIONS:
        raise ModelLoadError(
            f"Dense module {folder}: activation {act!r} is not supported (supported: {', '.join(ACTIVATIONS)})"
        )
    if cfg.get("use_residual"):
        raise ModelLoadError(f"Dense module {folder}: use_residual is not supported")
    for key in ("module_input_name", "module_output_name"):
        if cfg.get(key) not in (None, "sentence_embedding"):
            raise ModelLoadError(f"Dense module {folder}: {key} {cfg[key]!r} is not supported (sentence_embedding only)")
    try:
        return DenseStep(folder, int(cfg["in_features"]), int(cfg["out_features"]), bool(cfg.get("bias", True)),
                         ACTIVATIONS[act])
    except (KeyError, TypeError, ValueError) as e:
        raise ModelLoadError(f"Dense module {folder}: config.json needs in_features and out_features ({e})") from e


def read_pipeline(path: Path, default_pooling: str) -> Pipeline:
    """The pipeline of ``modules.json``; without one, ``default_pooling``
    and normalisation (what the model families' own cards do)."""
    prompts, default_prompt = read_prompts(path)
    modules = read_json(path / "modules.json")
    if modules is None:
        return Pipeline((default_pooling,), normalize=True, prompts=prompts, default_prompt_name=default_prompt)
    if not isinstance(modules, list):
        raise ModelLoadError(f"{path / 'modules.json'} is not a list of modules")
    pooling: tuple[str, ...] | None = None
    splade: SpladeStep | None = None
    steps: list[DenseStep | NormalizeStep] = []
    mlm = False
    for i, m in enumerate(sorted(modules, key=lambda m: int(m.get("idx", 0)))):
        kind = str(m.get("type", ""))
        name = kind.rsplit(".", 1)[-1]
        folder = path / str(m.get("path", ""))
        if name in ("Transformer", "MLMTransformer"):
            if i != 0 or folder != path:
                raise ModelLoadError(
                    f"{path}: a Transformer module at {m.get('path')!r} (not the first module, at the "
                    "directory's root) is not supported"
                )
            task = (read_json(path / "sentence_bert_config.json") or {}).get("transformer_task")
            task = "fill-mask" if name == "MLMTransformer" else task
            if task not in (None, "feature-extraction", "fill-mask"):
                raise ModelLoadError(f"{path}: Transformer task {task!r} is not supported")
            mlm = task == "fill-mask"
        elif name == "SpladePooling":
            if not mlm or pooling is not None or splade is not None:
                raise ModelLoadError(f"{path}: SpladePooling must follow a fill-mask (masked-LM) Transformer")
            splade = _splade(read_json(folder / "config.json") or {}, folder)
        elif name == "Pooling":
            if mlm:
                raise ModelLoadError(f"{path}: Pooling over masked-LM logits (fill-mask) is not supported")
            if pooling is not None or steps:
                raise ModelLoadError(f"{path}: a second Pooling, or one after Dense/Normalize, is not supported")
            pooling = pooling_modes(read_json(folder / "config.json") or {}, folder)
        elif name == "Dense":
            steps.append(_dense(folder))
        elif name == "Normalize":
            steps.append(NormalizeStep())
        elif name in _NO_OPS:
            continue
        else:
            raise ModelLoadError(
                f"{path}: sentence-transformers module {kind!r} ({m.get('path') or 'root'}) is not supported "
                "(supported: Transformer, Pooling, Dense, Normalize, Dropout, SpladePooling)"
            )
        if name in ("Dense", "Normalize") and pooling is None:
            raise ModelLoadError(f"{path}: {name} before Pooling (on token embeddings) is not supported")
    if splade is not None:
        if steps:
            raise ModelLoadError(f"{path}: Dense or Normalize after SpladePooling is not supported")
        return Pipeline((), prompts=prompts, default_prompt_name=default_prompt, splade=splade)
    if pooling is None:
        raise ModelLoadError(f"{path}: modules.json has no Pooling module")
    normalize = bool(steps) and isinstance(steps[-1], NormalizeStep)
    if normalize:
        steps.pop()
    return Pipeline(pooling, tuple(steps), normalize, prompts, default_prompt)
