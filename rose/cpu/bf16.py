"""The bfloat16 twin: a second copy of a float32 CPU model in bfloat16,
its linear layers packed for oneDNN, which multiplies bfloat16 on AMX
tiles where the CPU has them (Intel Sapphire Rapids and later).

Why: a large CPU step is matmuls, and float32 matmuls already run near
the cores' FMA peak; on AMX the same matmuls in bfloat16 run several
times faster (measured per step in ``docs/latency.md``). Attention, GELU
and the norms run in bfloat16 too, on PyTorch's vectorised kernels.

How, as every gated runtime (``gated.py``): the steps of an embedder's
primary output (dense, or SPLADE's vocabulary weights: vectors, which a
cosine can judge) fall into power-of-two token buckets; a bucket's first
step runs in float32 and is kept; a background thread (niced) builds the
twin once (the model loaded again, cast and packed: the tested ``--dtype
bfloat16`` path) and gates the bucket against that float32 output (cosine
0.999 on every row). A bucket that passes runs on the twin. Costs: the
twin's weights (half the float32 model's size), and nothing on a CPU or a
model where it is off.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..interface import Batch, OutputKind
from ..models import EmbeddingModel
from ..models import packed as packing
from ..models.load import load_model
from ..step.inputs import step_inputs
from .gated import Context, GatedRuntime, float32_cpu_refusal, power_of_two_bucket, power_of_two_buckets

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

    # Only where the CPU has AMX (Tulip's --cpu-bf16 auto); False: wherever
    # it has bfloat16 arithmetic (--cpu-bf16 true).
    require_amx: bool = True
    min_bucket: int = 16
    # The largest bucket ``Engine.warm`` builds; larger steps still run on
    # the twin once their own bucket is gated.
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


class Bf16Twin(GatedRuntime[EmbeddingModel]):
    """The bfloat16 copy of one model and its buckets' states."""

    name = "bf16"
    title = "bfloat16 steps"
    nice = 10
    Settings = Bf16Settings

    @classmethod
    def refusal(cls, ctx: Context, settings: Bf16Settings, beside: tuple[str, ...]) -> str | None:
        why = float32_cpu_refusal(ctx)
        if why is not None:
            return why
        if not ctx.packed:
            return "it needs the packed linear layers (--cpu-packed-linear)"
        if ctx.kind not in TWIN_KINDS:
            return (f"its gate judges vectors by cosine, and this model's {ctx.kind.value} output is not one (a "
                    "cross-encoder's logits stay float32)")
        return missing(settings.require_amx)

    def __init__(self, ctx: Context, settings: Bf16Settings | None = None):
        super().__init__(ctx, settings or Bf16Settings())
        self.spec = ctx.spec
        self.backend = ctx.backend

    def key(self, batch: Batch) -> int | None:
        if batch.kind is not self.kind:
            return None
        return self.settings.bucket(batch.layout.tokens)

    def _load(self) -> EmbeddingModel:
        model = load_model(self.spec, self.backend).to(torch.bfloat16)
        packing.pack_linears(model)
        return model

    def _execute(self, batch: Batch) -> torch.Tensor:
        model = self._runtime
        assert model is not None  # _build loads it before any step runs here
        lengths = batch.lengths
        x = step_inputs(batch.arena, batch.layout, self.backend, model.causal, lengths, max(lengths))
        return model(batch.kind, x).float()
