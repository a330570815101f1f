"""Linear layers with weights packed once for oneDNN, for float32 on the
CPU (and bfloat16, the twin of ``rose/cpu/bf16.py``, which oneDNN runs on
AMX tiles where the CPU has them).

PyTorch's CPU ``linear`` goes through a BLAS ``sgemm`` that repacks the
weight on every call; for the few rows of a query that repacking is most of
the work, and on CPUs where MKL picks no AVX-512 kernel (AMD) the rest runs
at half width. Packing each weight once at load time and multiplying with
oneDNN keeps the same precision (results differ from ``F.linear`` by
float32 rounding, about 1e-6 relative); what it gained is measured by the
CPU benchmarks (``docs/latency.md``).

The packed copy replaces the weight (no second copy in memory). A layer
whose weight its model reads directly (not through ``forward``) is marked
``weight_read_directly = True`` where it is built, and keeps both.

oneDNN compiles a kernel per input shape and keeps it in its primitive
cache (which Tulip bounds). Rows are therefore padded up to one of a few
sizes (``padded_rows``), so a model's packed layers need a fixed set of
kernels, whatever ragged batches arrive. PyTorch's own GELU also runs on
oneDNN, with no padding: a new kernel for every exact row count, evicting
others from the cache. That churn, small allocations made and freed among
the activations', fragmented the C heap: in a 30-minute soak of mixed
traffic Tulip's resident memory grew by 19–32% before levelling off. So
packing also turns PyTorch's own dispatch to oneDNN off for the process
(``torch.backends.mkldnn.enabled = False``; GELU then runs on PyTorch's
vectorised kernel) and the packed layers call oneDNN directly.
"""

from __future__ import annotations

import logging

import torch
from torch import nn
from torch.nn import functional as F

log = logging.getLogger(__name__)

# The row count the packed layout is chosen for (a query's tokens); any
# count runs on it.
PACK_ROWS = 16


def padded_rows(rows: int) -> int:
    """The row count a matmul of ``rows`` runs at: exact up to 16 (queries),
    then multiples of 16 up to 256, then 8 sizes per doubling (at most
    12.5% padding)."""
    if rows <= 16:
        return rows
    if rows <= 256:
        return (rows + 15) // 16 * 16
    step = (1 << (rows.bit_length() - 1)) // 8
    return (rows + step - 1) // step * step


def available() -> bool:
    """Whether this PyTorch has oneDNN and the packed-linear operators."""
    ops = torch.ops.mkldnn
    return (torch.backends.mkldnn.is_available() and hasattr(ops, "_reorder_linear_weight")
            and hasattr(ops, "_linear_pointwise"))


class PackedLinear(nn.Module):
    """``nn.Linear`` on a oneDNN-packed weight (float32 or bfloat16, CPU,
    inference)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        # Not a parameter or buffer: module machinery (``.to``, state dicts)
        # does not handle oneDNN's layout, and the model is final by now.
        self.packed = torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)
        self.kept = weight if getattr(linear, "weight_read_directly", False) else None
        self.bias = linear.bias

    @property
    def weight(self) -> torch.Tensor:
        """The weight as ``nn.Linear`` holds it (unpacked on each read unless kept)."""
        return self.kept if self.kept is not None else self.packed.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.reshape(-1, self.in_features)
        n = rows.shape[0]
        padded = padded_rows(n)
        if padded != n:
            rows = F.pad(rows, (0, 0, 0, padded - n))
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out[:n].reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


PACKED_DTYPES = (torch.float32, torch.bfloat16)


def pack_linears(model: nn.Module) -> int:
    """Replaces every float32 or bfloat16 ``nn.Linear`` in ``model`` (on the
    CPU) with a ``PackedLinear``; returns how many. Layers under a module
    marked ``blas_linears = True`` (one that only ever multiplies many rows,
    where the BLAS sgemm wins) are left alone."""
    keep = {id(m) for top in model.modules() if getattr(top, "blas_linears", False) for m in top.modules()}
    swaps = []
    for parent in model.modules():
        for name, child in parent.named_children():
            if (type(child) is nn.Linear and id(child) not in keep and child.weight.dtype in PACKED_DTYPES
                    and child.weight.device.type == "cpu"):
                swaps.append((parent, name, child))
    for parent, name, child in swaps:
        setattr(parent, name, PackedLinear(child))
    if swaps:
        # See the module's docstring: only padded shapes may reach oneDNN.
        torch.backends.mkldnn.enabled = False  # type: ignore[assignment]  # torch stubs type the flag as its descriptor
    return len(swaps)
