"""The adapters resident in one engine, and each step's choice of them.

Loading reads and places an adapter completely before it becomes
visible, and a step holds its adapters' deltas until it ends, so a step
never sees half an adapter. The projections any resident adapter targets
are wrapped (``LoraLinear``); once none does, the model's own modules are
back in place, so a model with no adapters is the model as loaded. The
wrapping and unwrapping wait for a step with adapters in progress on
another thread (its forward pass: on CUDA, until its kernels are
queued); a base step passes through a wrapper either way.

Bounds: ``max_adapters`` resident at once (a load beyond is refused, not
evicted: the host decides what to unload) and ``max_rank`` per module.
Each adapter costs its matrices' size in the model's dtype on its device
(a rank-16 adapter on MiniLM's query and value: 0.3 MB in float32).
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from ..errors import AdapterError, InvalidBatchError
from ..interface import Batch, OutputKind
from .linear import ACTIVE, AdapterStep, Delta, Key, LoraLinear
from .peft import read_peft
from .placement import layer_name, place, targets

# Defaults of the engine's bounds (``Engine.from_dir``).
MAX_ADAPTERS = 8
MAX_RANK = 64
# An adapter's name: what a host routes by (e.g. a model name in a request).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}")


@dataclass(frozen=True)
class AdapterInfo:
    """One resident adapter, as ``Engine.adapters()`` lists it."""

    name: str
    path: str
    rank: int  # the largest rank of its modules
    alpha: float  # lora_alpha
    rslora: bool
    targets: tuple[str, ...]  # the modules it adapts, as named in a transformers layer
    layers: int  # how many layers it adapts
    parameters: int  # numbers in its matrices
    load_seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class _Adapter:
    info: AdapterInfo
    deltas: dict[Key, Delta]
    share: float  # its matrices' work per token / the base layers' linear work per token


class Bank:
    """The adapters of one model. ``device`` and ``dtype``: where their
    matrices live (the model's)."""

    def __init__(self, model: nn.Module, family: str, device: torch.device, dtype: torch.dtype,
                 max_adapters: int = MAX_ADAPTERS, max_rank: int = MAX_RANK):
        if max_adapters < 0 or max_rank < 1:
            raise ValueError("max_adapters must be 0 or more and max_adapter_rank 1 or more")
        self.model = model
        self.family = family
        self.device = device
        self.dtype = dtype
        layers = getattr(model, "adapter_layers", lambda: ())()
        self.layers: Sequence[nn.Module] = layers
        # Why this model takes no adapters, or None.
        self.refusal = _refusal(model, family, layers, max_adapters)
        self.max_adapters = 0 if self.refusal else max_adapters
        self.max_rank = max_rank
        self._resident: dict[str, _Adapter] = {}
        self._wrapped: dict[Key, int] = {}  # projection -> resident adapters that target it
        # Loads and unloads (a host's admin thread) against each other and
        # against the forward of a step with adapters; base steps take none.
        self._lock = threading.Lock()
        self._linear_work = sum(_work(getattr(layer, attr)) for layer in layers
                                for attr in {a for a, _ in targets(layer).values()})

    def load(self, name: str, path: str | Path) -> AdapterInfo:
        if self.refusal:
            raise AdapterError(self.refusal)
        if not isinstance(name, str) or not NAME.fullmatch(name):
            raise AdapterError(f"adapter name {name!r} is not 1 to 128 of letters, digits and ._:/@+- (starting "
                               "with a letter or digit)")
        started = time.perf_counter()
        lora = read_peft(path)
        deltas, modules = place(lora, self.layers, self.family, self.max_rank, self.device, self.dtype)
        if not deltas:
            raise AdapterError(f"{path}: the adapter adapts nothing this model's outputs read")
        names = sorted({layer_name(m) for m in modules})
        params = sum(lora.modules[m].a.numel() + lora.modules[m].b.numel() for m in modules)
        work = sum(d.a_t.numel() + d.b_t.numel() for d in deltas.values())  # zero blocks included: computed
        with self._lock:
            if name in self._resident:
                raise AdapterError(f"an adapter named {name!r} is loaded already; unload it first")
            if len(self._resident) >= self.max_adapters:
                raise AdapterError(f"{len(self._resident)} adapters are loaded, this engine's bound "
                                   f"(max_adapters={self.max_adapters}); unload one first")
            rank = max(lora.modules[m].rank for m in modules)
            info = AdapterInfo(name, str(path), rank, lora.alpha, lora.rslora, tuple(names), len({k[0] for k in deltas}),
                               params, time.perf_counter() - started)
            for key in deltas:
                self._wrap(key)
            self._resident[name] = _Adapter(info, deltas, work / max(self._linear_work, 1))
        return info

    def unload(self, name: str) -> None:
        with self._lock:
            adapter = self._resident.pop(name, None)
            if adapter is None:
                raise AdapterError(f"no adapter named {name!r} is loaded")
            for key in adapter.deltas:
                self._unwrap(key)

    def list(self) -> tuple[AdapterInfo, ...]:
        """The resident adapters, in load order."""
        return tuple(a.info for a in list(self._resident.values()))

    def known(self, name: str) -> bool:
        return name in self._resident

    def step(self, batch: Batch) -> AdapterStep | None:
        """The adapters of ``batch`` (``Batch.adapters``: a name or None per
        sequence) and their rows, found once; None when no sequence takes
        one. Where an adapter's sequences are not side by side, the step
        runs them in the order of each choice's first sequence (stable).
        ``InvalidBatchError`` for a name no resident adapter has."""
        choice = batch.adapters
        if choice is None:
            return None
        if len(choice) != batch.num_sequences:
            raise InvalidBatchError(f"{len(choice)} adapter choices for {batch.num_sequences} sequences")
        names = list(dict.fromkeys(choice))  # None (the base model) among them
        if names == [None]:
            return None
        adapters: dict[int, _Adapter] = {}  # by the choice's index in names
        for i, name in enumerate(names):
            if name is not None:
                adapter = self._resident.get(name)
                if adapter is None:
                    raise InvalidBatchError(f"adapter {name!r} is not loaded")
                adapters[i] = adapter
        group = np.array([names.index(n) for n in choice])
        lengths = np.asarray(batch.lengths)
        order = None
        if np.count_nonzero(np.diff(group)) + 1 > len(names):  # a choice's sequences in several runs
            order = np.argsort(group, kind="stable")
            group, lengths = group[order], lengths[order]
        cu = np.concatenate(([0], np.cumsum(lengths)))
        first = np.flatnonzero(np.r_[True, group[1:] != group[:-1]])  # one run per choice now
        count = np.bincount(group, minlength=len(names))
        groups, chosen, adapted = [], [], 0.0
        for start in first:
            adapter = adapters.get(int(group[start]))
            if adapter is not None:
                rows = slice(int(cu[start]), int(cu[start + count[group[start]]]))
                groups.append((rows, adapter.deltas))
                chosen.append(adapter.info.name)
                adapted += (rows.stop - rows.start) * adapter.share
        return AdapterStep(tuple(groups), tuple(chosen), order, adapted)

    @contextmanager
    def applied(self, step: AdapterStep):
        """The calling thread's projections add ``step``'s deltas inside
        (no adapter wrapped or unwrapped meanwhile)."""
        with self._lock:
            for name, (_, deltas) in zip(step.names, step.groups):
                adapter = self._resident.get(name)
                if adapter is None or adapter.deltas is not deltas:  # unloaded since the step was planned
                    raise InvalidBatchError(f"adapter {name!r} is not loaded")
            ACTIVE.step = step
            try:
                yield
            finally:
                ACTIVE.step = None

    def _wrap(self, key: Key) -> None:
        n = self._wrapped.get(key, 0)
        if n == 0:
            layer = self.layers[key[0]]
            setattr(layer, key[1], LoraLinear(getattr(layer, key[1]), key))
        self._wrapped[key] = n + 1

    def _unwrap(self, key: Key) -> None:
        n = self._wrapped[key] - 1
        if n == 0:
            layer = self.layers[key[0]]
            setattr(layer, key[1], getattr(layer, key[1]).base)
            del self._wrapped[key]
        else:
            self._wrapped[key] = n


def _work(linear: nn.Module) -> int:
    return int(linear.in_features) * int(linear.out_features)  # type: ignore[arg-type]


def _refusal(model: nn.Module, family: str, layers: Sequence[nn.Module], max_adapters: int) -> str | None:
    if max_adapters == 0:
        return "adapters are off on this engine (max_adapters=0)"
    if not layers or OutputKind.DENSE not in getattr(model, "kinds", ()):
        return (f"this {family} model takes no adapters: ROSE applies LoRA adapters to BERT, XLM-RoBERTa, MPNet, "
                "ModernBERT, NomicBERT and Qwen3 embedders")
    return None
