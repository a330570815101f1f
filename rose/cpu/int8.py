"""int8 steps on the CPU fast path: an int8 copy of ONNX Runtime's float32
session (``onnx.py``), taking the same small steps where its output is
exact enough.

Why: a small step's time is its matmuls, and on a CPU with int8
dot-product instructions (AVX-512 VNNI, AVX-VNNI, ARM's dot product) an
int8 matmul does four times the multiply-adds of a float32 one per
instruction. Measured per step in ``docs/latency.md``, with what int8 does
to the vectors.

How, as every gated runtime (``gated.py``), on the fast path's buckets: a
bucket's first step runs in float32 and is kept; a background thread
builds the int8 session once (from the export cache, ``cache.py``, under
its own key, or else a child process quantizes the fast path's float32
export into it: ``int8_quantize.py``) and gates the bucket against that
float32 output, cosine 0.999 on every row. A bucket that passes runs in
int8; one that misses stays float32 for good, on the float32 session
(counted as ``onnx`` steps), and its cosine is kept (``gates``) and
logged. Embedders only: a cross-encoder's scores and a classifier's logits
are not vectors a cosine can bound, and stay float32.

Costs: a second session beside the float32 one (its weights a quarter of
the float32 ones' size, embedding tables kept float32), a copy on disk
within the cache's bound, and seconds of one niced core to quantize once.
"""

from __future__ import annotations

import functools
import platform
import sys
from dataclasses import dataclass
from pathlib import Path

from ..interface import OutputKind
from .cache import export_key
from .gated import Context
from .int8_quantize import OPS
from .onnx import OnnxRuntime, OnnxSettings, cached_session, export_entry, run_child

# Vectors, which the gate's cosine judges: an embedder's primary output.
INT8_KINDS = (OutputKind.DENSE,)

# /proc/cpuinfo flag → the instructions' name.
_DOT_FLAGS = {"avx512_vnni": "AVX-512 VNNI", "avx_vnni": "AVX-VNNI", "asimddp": "ARM dot product"}


@functools.lru_cache(maxsize=1)
def dot_products() -> str | None:
    """This CPU's int8 dot-product instructions by name, or None."""
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return "ARM dot product"  # every Apple core has them
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    flags = {f for line in text.splitlines() if line.startswith(("flags", "Features"))
             for f in line.partition(":")[2].split()}
    return next((name for flag, name in _DOT_FLAGS.items() if flag in flags), None)


@dataclass(frozen=True)
class Int8Settings(OnnxSettings):
    """The fast path's settings (its buckets, threads and cache: the int8
    copy takes the same steps), and which CPUs get int8 steps."""

    # Only where the CPU has int8 dot products (Tulip's --cpu-int8 auto);
    # False: on any CPU (--cpu-int8 true).
    require_dot: bool = True
    # The gate's cosine; None: gated.FIDELITY. Internal: tests raise it to
    # 1.0 to see a real int8 output refused.
    fidelity: float | None = None

    def recipe(self) -> dict[str, str]:
        """How the copy is quantized (part of its cache key). Weights per
        output channel: per tensor, MiniLM's vectors lost 7-9 times more
        cosine (1 - cosine 0.077-0.18 against 0.008-0.025), in the same
        step time. 7-bit weights only without dot products, where ONNX Runtime's
        int8 kernels add pairs of products in 16 bits and full-range weights
        can saturate them; with dot products they only cost cosine."""
        return {"int8_ops": ",".join(OPS), "int8_per_channel": "1",
                "int8_reduce_range": "0" if dot_products() else "1"}


class OnnxInt8Runtime(OnnxRuntime):
    """The int8 session of one model and its buckets' states."""

    name = "onnx_int8"
    title = "int8 CPU fast path"
    Settings = Int8Settings

    @classmethod
    def refusal(cls, ctx: Context, settings: OnnxSettings, beside: tuple[str, ...]) -> str | None:
        if ctx.kind not in INT8_KINDS:
            return (f"its gate judges an embedder's vectors by cosine, and this model's {ctx.kind.value} output "
                    "is not one (a cross-encoder's scores and a classifier's logits stay float32)")
        why = OnnxRuntime.refusal(ctx, settings, beside)  # the fast path's own conditions
        forced = isinstance(settings, Int8Settings) and not settings.require_dot
        if why is None and not forced and dot_products() is None:
            why = ("this CPU has no int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI, ARM dot product): "
                   "auto turns int8 steps on only there; --cpu-int8 true forces them")
        return why

    def __init__(self, ctx: Context, settings: Int8Settings | None = None):
        super().__init__(ctx, settings or Int8Settings())

    def cache_key(self) -> str:
        return export_key(self.model_dir, {**self.settings.plan(), **self.settings.recipe()})[0]

    def _load(self):
        return int8_session(self.model_dir, self.settings)


def int8_session(model_dir: Path, settings: Int8Settings):
    """An ONNX Runtime session of the model's int8 copy: the cached one,
    else one quantized now (in a child process) from the float32 export."""
    recipe = settings.recipe()
    key, meta = export_key(model_dir, {**settings.plan(), **recipe})

    def make(staging: Path) -> None:
        src = export_entry(model_dir, settings) / "model.onnx"
        run_child("rose.cpu.int8_quantize", [str(src), str(staging / "model.onnx"), "--per-channel",
                                             *(["--reduce-range"] if recipe["int8_reduce_range"] == "1" else [])],
                  staging, "int8 quantization")

    return cached_session(settings, key, meta, make, "int8 CPU fast path", "int8 copy", "quantized")
