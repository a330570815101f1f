"""The simulated device's cost model: how long one step runs on the device.

    t = t0 + a * tokens + b * sum(len_i ** 2)

per step, over the sequences the device computes (a padded step's filler
segment included: the device computes it too). ``t0`` is the time any step
takes (reading the weights once), ``a`` the per-token cost of the linear
layers, ``b`` the attention cost that grows with the square of each
sequence's length.

Two named models of BGE-M3 (XLM-RoBERTa large, bf16) on one H200, both
from the published figures the project's benchmarks are judged against
(``bench/README.md``), chosen with ``--sim-cost roofline|published``:

``roofline`` (the default): what the device could do, from its two roofs.

- ``t0`` = 0.15 ms: the memory roof. A 128-token query reads about 0.6 GB of
  layer weights; at the H200's measured ~4.3 TB/s copy rate that is ~0.15 ms,
  whatever the step's size.
- ``a`` = 1 / (2,100 x 512) s per token = 0.930 us: the compute roof. A
  forward over 100 x 512 tokens is ~36 TFLOP, ~2,100 embeddings/s at the
  measured ~790 TFLOP/s of dense bf16, all of it charged to the per-token
  term.
- ``b``: least squares over the published Tulip online p50s at 128, 512 and
  4,096 tokens (1.53, 2.03, 9.57 ms), after ``t0 + a * len``:
  ~3.36e-4 us per len^2. The 4,096-token point decides it; the two short
  ones cannot be matched by any ``b`` (the model gives 0.28 and 0.71 ms),
  and 100 x 512 comes out at ~1,770 embeddings/s, 18% above the published
  stack's ~1,500. Faster than the measured device up to where long
  sequences dominate (at 4,096 tokens both give ~9.6 ms).

``published``: the device as measured with its host, the three constants
solved exactly from the same three published p50s (three points, three
unknowns): ``t0`` = 1.3766 ms, ``a`` = 1.173e-3 ms per token, ``b`` =
2.02e-7 ms per len^2. It reproduces 1.53 / 2.03 / 9.57 ms at 128 / 512 /
4,096 tokens and gives ~1,499 embeddings/s on 100 x 512. Its ``t0`` holds
what the published stack spends per step beyond the roofs (kernel launch
latency, small kernels that do not fill the GPU, its host path), so it is
the slower, more pessimistic device for anything that takes many small
steps.

Image steps (a ViT: CLIP's or SigLIP's vision tower) get the same three
constants, scaled by the tower's own work (``VisionWork``): per image,
``a`` times its tokens' linear work (QKV, output and MLP matmuls: 2 x
layers x (4 h^2 + 2 h ffn) FLOPs a token, plus the patch embedding) over
BGE-M3's per token, plus ``b`` times its tokens squared, scaled by its
layers x hidden over BGE-M3's (attention's work per len^2); ``t0`` once a
step. The image tower computes every slot of a padded step. So the image
term inherits whatever device the constants describe (roofline,
published, or a calibration) at BGE-M3's achieved rate, with no constant
of its own: ViT-B/16 at 224 px (197 tokens) comes out at ~57 us an image
on the roofline H200 (``docs/models.md``).

``calibrate`` (and ``bench/gpu/calibrate.py``) fits the three constants to a
real device's step timings instead.

LoRA adapters add ``a * adapted``: a token that took an adapter costs the
adapter's share of the linear work once more (its matrices' size over the
layers' linear weights': 2.8% for rank 16 on MiniLM's query and value, the
key's zero block between them included), ``adapted`` summing that share
over the step's adapted tokens
(``rose/adapters``). No constant of its own: it is the LoRA matmuls' FLOPs
at the linear layers' rate, a lower bound for small matmuls, which run
below that rate on a GPU.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

# Published BGE-M3 figures on one H200 (bf16), from the reference reading.
MEMORY_ROOF_S = 0.15e-3
COMPUTE_ROOF_EMB_PER_S = 2100.0
COMPUTE_ROOF_LENGTH = 512
PUBLISHED_ONLINE_P50_S = {128: 1.53e-3, 512: 2.03e-3, 4096: 9.57e-3}


# BGE-M3's (XLM-RoBERTa large) layers, whose work the constants were fitted on.
_REFERENCE_LAYERS, _REFERENCE_HIDDEN, _REFERENCE_FFN = 24, 1024, 4096


def _linear_flops(layers: int, hidden: int, ffn: int) -> int:
    """FLOPs of one token through the layers' matmuls (QKV, output, MLP)."""
    return 2 * layers * (4 * hidden * hidden + 2 * hidden * ffn)


REFERENCE_LINEAR_FLOPS = _linear_flops(_REFERENCE_LAYERS, _REFERENCE_HIDDEN, _REFERENCE_FFN)
REFERENCE_ATTENTION_WIDTH = _REFERENCE_LAYERS * _REFERENCE_HIDDEN


@dataclass(frozen=True)
class VisionWork:
    """A vision tower's shape, for its image term: ``tokens`` per image,
    its ``layers``, ``hidden`` and ``ffn`` widths, and the values of one
    patch (channels x patch^2)."""

    tokens: int
    layers: int
    hidden: int
    ffn: int
    patch_values: int

    @classmethod
    def of(cls, vision_config: dict, class_token: bool) -> VisionWork:
        """From a ``vision_config`` (CLIP: ``class_token``)."""
        grid = int(vision_config["image_size"]) // int(vision_config["patch_size"])
        return cls(grid * grid + int(class_token), int(vision_config["num_hidden_layers"]),
                   int(vision_config["hidden_size"]), int(vision_config["intermediate_size"]),
                   int(vision_config.get("num_channels", 3)) * int(vision_config["patch_size"]) ** 2)

    @property
    def linear_flops(self) -> int:
        """One image's matmul FLOPs: its tokens through the layers, and
        the patch embedding."""
        patches = self.tokens - 1 if self.tokens > 1 else self.tokens
        return (self.tokens * _linear_flops(self.layers, self.hidden, self.ffn)
                + 2 * patches * self.patch_values * self.hidden)


@dataclass(frozen=True)
class CostModel:
    """Seconds per step: ``t0 + a * tokens + b * sum(len^2)``."""

    t0: float
    a: float
    b: float
    # Reported beside every figure; not part of the model's identity.
    name: str = field(default="", compare=False)

    def __post_init__(self):
        for key in ("t0", "a", "b"):
            v = getattr(self, key)
            if not (isinstance(v, float | int) and np.isfinite(v) and v >= 0):
                raise ValueError(f"sim cost {key} must be a finite number >= 0, got {v!r}")

    def seconds(self, lengths, adapted: float = 0.0) -> float:
        """Device seconds of one step over sequences of these lengths,
        ``adapted`` of its tokens' worth of LoRA work beside."""
        tokens = 0
        squares = 0
        for n in lengths:
            tokens += n
            squares += n * n
        return self.t0 + self.a * (tokens + adapted) + self.b * squares

    def image_seconds(self, images: int, work: VisionWork) -> float:
        """Device seconds of one image step over ``images`` images (the
        slots computed, padding included) of a tower of ``work``."""
        linear = self.a * work.linear_flops / REFERENCE_LINEAR_FLOPS
        attention = self.b * work.tokens**2 * (work.layers * work.hidden) / REFERENCE_ATTENTION_WIDTH
        return self.t0 + images * (linear + attention)

    def describe(self) -> str:
        constants = f"t0={self.t0 * 1e3:.4g} ms, a={self.a * 1e6:.4g} us/token, b={self.b * 1e6:.4g} us/len^2"
        return f"{self.name}: {constants}" if self.name else constants

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def parse(cls, text: str) -> "CostModel":
        """``--sim-cost``: empty for the default (``roofline``), a model's
        name (``MODELS``), ``t0,a,b`` in seconds, or the path of a JSON file
        ``{"t0": .., "a": .., "b": ..}`` (what ``bench/gpu/calibrate.py``
        writes)."""
        text = (text or "").strip()
        if not text:
            return DEFAULT
        if text in MODELS:
            return MODELS[text]
        if "," in text:
            parts = text.split(",")
            if len(parts) != 3:
                raise ValueError(f"--sim-cost wants t0,a,b (seconds), got {text!r}")
            try:
                t0, a, b = (float(p) for p in parts)
                return cls(t0, a, b)
            except ValueError:
                raise ValueError(f"--sim-cost wants three numbers t0,a,b, got {text!r}") from None
        path = Path(text)
        if not path.is_file():
            raise ValueError(f"--sim-cost {text!r} is neither a model name ({', '.join(MODELS)}), t0,a,b "
                             "nor a readable file")
        try:
            data = json.loads(path.read_text())
            return cls(float(data["t0"]), float(data["a"]), float(data["b"]), name=path.name)
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"--sim-cost file {text}: expected JSON with t0, a, b in seconds ({e})") from None


def fit(steps: list[tuple[list[int], float]]) -> CostModel:
    """Least-squares ``t0, a, b`` from ``(sequence lengths, seconds)`` per
    step, on relative errors (timing noise grows with the step, and a
    1 ms query should weigh as much as a 50 ms batch); negative
    coefficients (noise on a tiny term) are clamped to 0 and the others
    refitted without them."""
    if len(steps) < 3:
        raise ValueError("fitting t0, a, b needs at least three steps")
    x = np.array([[1.0, float(sum(ls)), float(sum(n * n for n in ls))] for ls, _ in steps])
    y = np.array([float(s) for _, s in steps])
    if (y <= 0).any():
        raise ValueError("step times must be positive")
    x, y = x / y[:, None], np.ones_like(y)
    active = [0, 1, 2]
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        negative = [i for i, c in zip(active, coef) if c < 0]
        if not negative:
            break
        active = [i for i in active if i not in negative]
        if not active:
            return CostModel(0.0, 0.0, 0.0)
    full = [0.0, 0.0, 0.0]
    for i, c in zip(active, coef):
        full[i] = float(c)
    t0, a, b = full
    return CostModel(t0, a, b)


def _roofline() -> CostModel:
    t0 = MEMORY_ROOF_S
    a = 1.0 / (COMPUTE_ROOF_EMB_PER_S * COMPUTE_ROOF_LENGTH)
    # b: least squares of b * L^2 against (published p50 - t0 - a * L).
    num = sum(L * L * (y - t0 - a * L) for L, y in PUBLISHED_ONLINE_P50_S.items())
    den = sum(float(L) ** 4 for L in PUBLISHED_ONLINE_P50_S)
    return CostModel(t0, a, num / den, name="roofline")


def _published() -> CostModel:
    # t0 + a * L + b * L^2 through the three published points: exact.
    lengths = sorted(PUBLISHED_ONLINE_P50_S)
    x = np.array([[1.0, float(L), float(L) ** 2] for L in lengths])
    y = np.array([PUBLISHED_ONLINE_P50_S[L] for L in lengths])
    t0, a, b = (float(v) for v in np.linalg.solve(x, y))
    return CostModel(t0, a, b, name="published")


MODELS = {m.name: m for m in (_roofline(), _published())}
DEFAULT = MODELS["roofline"]
