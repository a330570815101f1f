"""The bfloat16 twin: a second copy of a float32 CPU model in bfloat16,
its linear layers packed for oneDNN, which multiplies bfloat16 on AMX
tiles where the CPU has them (Intel Sapphire Rapids and later).

Why: a large CPU step is matmuls, and float32 matmuls already run near
the cores' FMA peak (~330 GFLOP/s on 2 cores of the Intel Xeon
development VM, packed or MKL). The same matmuls in bfloat16 on AMX ran at
2.2-2.9 TFLOP/s there. Whole steps, in-process, 2 threads, against the
float32 eager step (packed linear layers): a 26 x 128-token XLM-R step
(multilingual MiniLM's shape) 677 -> 189 ms, an all-MiniLM-L6-v2 step of
16 x 256 tokens 486 -> 126 ms, of 1 x 60 tokens 10 -> 4.6 ms; the lowest
row cosine against float32 on those steps was 0.99987. Attention, GELU
and the norms run in bfloat16 too, on PyTorch's vectorised kernels.

How: as the CPU fast path (``rose/gated.py``): the steps of an embedder's
primary output (dense, or SPLADE's vocabulary weights: vectors, which a
cosine can judge) fall into power-of-two token buckets; a bucket's first step
runs in float32 and is kept; a background thread (niced) builds the twin
once (the model loaded again, cast and packed: the tested ``--dtype
bfloat16`` path) and gates the bucket against that float32 output (cosine
0.999 on every row). A bucket that passes runs on the twin. Costs: the
twin's weights (half the float32 model's size), and nothing on a CPU or a
model where it is off.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .attention import AttentionBackend
from .config import ModelSpec
from .gated import GatedRuntime, power_of_two_bucket, power_of_two_buckets
from .interface import Batch, OutputKind
from .layout import step_inputs
from .models import packed as packing

log = logging.getLogger("rose.cpubf16")

# Outputs whose rows are vectors, which the gate's cosine judges. A
# cross-encoder's logits (score, classify) are not: in bfloat16 they moved
# by ~0.01 on the test models, which a cosine over a row cannot bound.
TWIN_KINDS = (OutputKind.DENSE, OutputKind.SPARSE_VOCAB)


def amx() -> bool:
    """Whether this CPU has AMX tiles (oneDNN's bfloat16 matmuls use them)."""
    probe = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(probe is not None and probe())


def missing(require_amx: bool) -> str | None:
    """Why the twin cannot run here, or None. ``require_amx``: only where
    it was measured to pay (``auto``); without it, any CPU with native
    bfloat16 arithmetic (AVX-512 BF16) will do."""
    if not packing.available():
        return "this PyTorch has no oneDNN packed linear"
    if not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return "this CPU has no bfloat16 arithmetic (AVX-512 BF16 or AMX)"
    if require_amx and not amx():
        return "this CPU has no AMX tiles (auto turns bfloat16 steps on only there; --cpu-bf16 true forces them)"
    return None


@dataclass(frozen=True)
class Bf16Settings:
    """Which steps the twin takes."""

    min_bucket: int = 16
    # The largest bucket ``Engine.warm_cpu_bf16`` builds; larger steps
    # still run on the twin once their own bucket is gated.
    warm_tokens: int = 4096

    def __post_init__(self):
        if self.min_bucket < 1 or self.warm_tokens < 1:
            raise ValueError("bfloat16 twin limits must be positive")

    def bucket(self, tokens: int) -> int:
        return power_of_two_bucket(tokens, self.min_bucket)

    def buckets(self) -> list[int]:
        return power_of_two_buckets(self.min_bucket, self.warm_tokens)

    def warm_steps(self) -> list[int]:
        """Step sizes (tokens) that reach every bucket up to ``warm_tokens``."""
        return self.buckets()


class Bf16Twin(GatedRuntime):
    """The bfloat16 copy of one model and its buckets' states."""

    label = "bfloat16 twin"
    nice = 10

    def __init__(self, spec: ModelSpec, kind: OutputKind, backend: AttentionBackend,
                 settings: Bf16Settings | None = None):
        super().__init__(kind)
        self.spec = spec
        self.backend = backend
        self.settings = settings or Bf16Settings()

    def key(self, batch: Batch) -> int | None:
        if batch.kind is not self.kind:
            return None
        return self.settings.bucket(batch.layout.tokens)

    def _load(self):
        from .engine import load_model  # the engine imports this module

        model = load_model(self.spec, self.backend).to(torch.bfloat16)
        packing.pack_linears(model)
        return model

    def _execute(self, batch: Batch) -> torch.Tensor:
        lengths = batch.lengths
        x = step_inputs(batch.arena, batch.layout, self.backend, self._runtime.causal, lengths, max(lengths))
        return self._runtime(batch.kind, x).float()
