"""Where an adapter's matrices go in a ROSE model: PEFT names modules as
transformers' layers do (``encoder.layer.3.attention.self.query``), ROSE
fuses some of them (query, key and value in one ``qkv``; gate and up in
one ``gate_up``). Each family's layer declares the map (``peft_names``:
a transformers name in the layer → its linear and which part of that
linear's output; ``peft_parts``: the part sizes of a fused linear).

The matrices of one fused linear's parts become one ``Delta``: their A's
stacked, their B's on a block diagonal (the scale folded in), so an
adapter on query and value costs two matmuls per step on ``qkv``, not
four.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

import torch
from torch import nn

from ..errors import AdapterError
from .linear import Delta, Key
from .peft import Matrices, PeftLora

log = logging.getLogger("rose.adapters")

# A module of the base model in its numbered layers: the layer and the
# module's name inside it.
_IN_LAYER = re.compile(r"^(?:.*?\.)?layers?\.(?P<index>\d+)\.(?P<name>.+)$")
# Modules whose output no embedding reads (BERT's pooler: sentence
# transformers pools the hidden states): an adapter on them changes nothing.
_UNREAD = ("pooler.dense",)


def layer_name(module: str) -> str:
    """A module's name inside its layer (``attention.self.query``)."""
    m = _IN_LAYER.match(module)
    return m["name"] if m else module


def targets(layer: nn.Module) -> dict[str, tuple[str, int | None]]:
    """A layer's map of transformers module names to (linear, part)."""
    return getattr(layer, "peft_names", {})


def place(lora: PeftLora, layers: Sequence[nn.Module], family: str, max_rank: int, device: torch.device,
          dtype: torch.dtype) -> tuple[dict[Key, Delta], list[str]]:
    """The adapter's deltas by projection, on ``device`` in ``dtype``, and
    the modules they come from (those no output reads left out);
    ``AdapterError`` for a module the family's layers do not have, a rank
    over ``max_rank``, or shapes of another base model."""
    where = lora.path
    parts: dict[Key, dict[int | None, tuple[str, Matrices]]] = {}
    for module, m in lora.modules.items():
        if m.rank > max_rank:
            raise AdapterError(f"{where}: module {module} has rank {m.rank}, over this engine's bound "
                               f"max_adapter_rank={max_rank}")
        found = _IN_LAYER.match(module)
        if found is None:
            if module.endswith(_UNREAD):
                log.info("%s: %s is not read by any output; its adapter matrices are ignored", where, module)
                continue
            raise AdapterError(f"{where}: module {module} is not in a transformer layer; ROSE applies adapters to "
                               "the layers' linear projections only")
        index, name = int(found["index"]), found["name"]
        if index >= len(layers):
            raise AdapterError(f"{where}: module {module} is in layer {index}, and this {family} model has "
                               f"{len(layers)} layers: the adapter was trained for another base model")
        names = targets(layers[index])
        if name not in names:
            known = ", ".join(sorted(names))
            raise AdapterError(f"{where}: target module {name!r} (in {module}) is not a projection ROSE adapts in "
                               f"{family}; it adapts {known}")
        attr, part = names[name]
        slot = parts.setdefault((index, attr), {})
        if part in slot or (None in slot) or (part is None and slot):
            raise AdapterError(f"{where}: modules {slot[next(iter(slot))][0]} and {module} adapt the same output")
        slot[part] = (module, m)
    deltas = {key: _fuse(key, slot, layers[key[0]], where, device, dtype) for key, slot in parts.items()}
    return deltas, [module for slot in parts.values() for module, _ in slot.values()]


def _fuse(key: Key, slot: dict[int | None, tuple[str, Matrices]], layer: nn.Module, where, device: torch.device,
          dtype: torch.dtype) -> Delta:
    """One projection's delta from its adapted parts."""
    attr = key[1]
    linear = getattr(layer, attr)
    sizes = [int(linear.out_features)] if None in slot else list(getattr(layer, "peft_parts", {})[attr])
    starts = [sum(sizes[:i]) for i in range(len(sizes) + 1)]
    chosen = sorted(0 if p is None else p for p in slot)
    lo, hi = starts[chosen[0]], starts[chosen[-1] + 1]
    rank = sum(m.rank for _, m in slot.values())
    a = torch.empty(rank, int(linear.in_features))
    b = torch.zeros(hi - lo, rank)
    offset = 0
    for part in chosen:
        module, m = slot[part if part in slot else None]
        if m.a.shape[1] != linear.in_features or m.b.shape[0] != sizes[part]:
            raise AdapterError(f"{where}: module {module}: lora_A {list(m.a.shape)} and lora_B {list(m.b.shape)} do "
                               f"not fit ROSE's projection ({linear.in_features} inputs, {sizes[part]} outputs): the "
                               "adapter was trained for another base model")
        a[offset:offset + m.rank] = m.a
        b[starts[part] - lo:starts[part + 1] - lo, offset:offset + m.rank] = m.b * m.scale
        offset += m.rank
    return Delta(a.t().contiguous().to(device, dtype), b.t().contiguous().to(device, dtype), lo, hi)
