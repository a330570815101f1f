"""Issue 48's modelled figure: image steps of a CLIP ViT-B/16 (224 px,
197 tokens per image) on the simulated H200, under each of the simulated
device's cost models (``rose/sim/cost.py``: ``roofline``, the default, and
``published``). A real ``SimEngine`` is built from a CLIP ViT-B/16
``config.json`` (transformers' ``CLIPConfig``; the simulated device reads
no weights) and runs ``step_images`` at each image count; the device time
of each step is read from its ``--sim-log`` (the step after capture, as a
served step replays). A model of a GPU, not a measurement of one: the
image term reuses the constants fitted to BGE-M3's text steps, scaled by
the vision tower's share of the work (docs/simulated-device.md)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

from bench.harness import plots
from bench.harness.results import table
from bench.harness.stack import Stack

TITLE = "Image steps on the simulated H200: CLIP ViT-B/16, time per step and images/s by image count"

COUNTS = (1, 2, 4, 8, 16, 32, 64)
MODELS = ("roofline", "published")


def _vit_b16(dir: Path) -> Path:
    from transformers import CLIPConfig

    cfg = CLIPConfig(vision_config={"image_size": 224, "patch_size": 16, "hidden_size": 768,
                                    "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12},
                     projection_dim=512)
    cfg.save_pretrained(dir)
    return dir


def _step_seconds(model_dir: Path, cost: str, count: int, log: Path) -> float:
    """Device seconds of a replayed ``count``-image step."""
    from rose.interface import Images
    from rose.sim import SimEngine, SimSettings
    from rose.sim.stream import read_log

    log.unlink(missing_ok=True)
    engine = SimEngine.from_dir(model_dir, settings=SimSettings.from_flags(cost=cost, log_path=str(log)))
    size = engine.info.image_size
    pixels = np.random.default_rng(count).standard_normal((count, 3, *size), dtype=np.float32)
    modes = []
    for _ in range(4):  # warm-up, capture, then replays
        lazy = engine.step_images(Images(pixels))
        lazy.tensor()
        modes.append(lazy.info.mode)
        lazy.release()
    steps = read_log(log)
    last = steps[-1]
    assert modes[-1] in ("image_replay", "image_eager"), modes
    return (last["end"] - last["start"]) / 1e9


def run(stack: Stack) -> tuple[dict, str]:
    scratch = Path(tempfile.mkdtemp(prefix="bench-sim-images-"))
    try:
        model = _vit_b16(scratch / "clip-vit-b16")
        info = json.loads((model / "config.json").read_text())["vision_config"]
        results = {cost: {str(n): _step_seconds(model, cost, n, scratch / "sim.log") for n in COUNTS}
                   for cost in MODELS}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    data = {"params": {"model": "CLIP ViT-B/16 (transformers CLIPConfig, config only)", "image_size": 224,
                       "patch_size": info["patch_size"], "tokens_per_image": 197, "counts": list(COUNTS)},
            "step_seconds": results,
            "per_image_ms": {c: {n: s / int(n) * 1e3 for n, s in r.items()} for c, r in results.items()},
            "images_per_second": {c: {n: int(n) / s for n, s in r.items()} for c, r in results.items()}}
    rows = [[n, *(f"{results[c][str(n)] * 1e3:.3f}" for c in MODELS),
             *(f"{n / results[c][str(n)]:.0f}" for c in MODELS)] for n in COUNTS]
    md = "\n".join([
        "A CLIP ViT-B/16 (224 px, 197 tokens an image) on the simulated H200: the device time of a replayed "
        "image step, under each cost model. Modelled, not measured: the image term scales the text steps' "
        "constants (fitted to BGE-M3) by the vision tower's work.\n",
        table(["images", *(f"{c} step (ms)" for c in MODELS), *(f"{c} images/s" for c in MODELS)], rows),
    ])
    return data, md


def options(scale: float) -> dict:
    return {}


def plot(data: dict, path: Path) -> Path:
    """Images/s by image count, one line per cost model."""
    plt = plots._plt()
    fig, ax = plt.subplots(figsize=(6, 4))
    for cost, by_count in data["images_per_second"].items():
        counts = [int(n) for n in by_count]
        ax.plot(counts, list(by_count.values()), marker="o", label=cost)
    ax.set_xscale("log", base=2)
    return plots.finish(plt, fig, ax, path, "images per step", "images/s (modelled)",
                        "CLIP ViT-B/16 on the simulated H200")
