"""Issue 48's end-to-end figure: image embeddings per second on the CPU
through Ivy → Tulip (Ivy decodes and prepares each JPEG in Rust, Tulip runs
the vision tower through ROSE) against sentence-transformers' CLIP path in
one process (PIL opens the same bytes; its CLIPModel module runs
transformers' image processor and ``get_image_features``), on the same
random-weight CLIP ViT-B/32 (224 px, 50 tokens an image: the shape of
openai/clip-vit-base-patch32 and sentence-transformers' clip-ViT-B-32),
the same threads, the same images. Sides run in interleaved rounds of one
batch each; the gate compares every image's vector between the sides."""

from __future__ import annotations

import base64
import io
import json
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import gate, plots
from bench.harness.results import table
from bench.harness.stack import Stack
from bench.harness.timing import interleave, ratio, scaled

TITLE = "Image embeddings on the CPU: Ivy → Tulip vs sentence-transformers' CLIP path (ViT-B/32, images/s)"

BATCH = 16
SIZE = (640, 480)


def _clip_b32(out: Path) -> Path:
    """A CLIP ViT-B/32 with seeded random weights, the all-MiniLM-L6-v2
    tokenizer for its text side (unused here) and CLIP's own image
    preprocessing (shortest edge 224, centre crop 224, bicubic)."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    from bench.harness.tiny_models import _tokenizer

    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    cfg = CLIPConfig(text_config={"vocab_size": 30522, "bos_token_id": 101, "eos_token_id": 102, "pad_token_id": 0,
                                  "max_position_embeddings": 77},
                     vision_config={"image_size": 224, "patch_size": 32}, projection_dim=512)
    CLIPModel(cfg).eval().save_pretrained(str(out), safe_serialization=True)
    _tokenizer(out, "all-minilm-l6-v2", model_max_length=77)
    CLIPImageProcessor(size={"shortest_edge": 224}, crop_size={"height": 224, "width": 224}).save_pretrained(out)
    return out


def _photos(n: int) -> list[bytes]:
    """Photo-like 640x480 JPEGs (quality 90): smooth gradients with noise,
    seeded, so the decoder and the resize do a photo's work."""
    from PIL import Image

    w, h = SIZE
    y, x = np.mgrid[0:h, 0:w]
    out = []
    for i in range(n):
        rng = np.random.default_rng(i)
        phase = rng.uniform(0, 6.28, 3)
        base = np.stack([127 + 100 * np.sin(x / (40 + 10 * k) + phase[k]) * np.cos(y / (55 + 7 * k)) for k in range(3)],
                        axis=-1)
        pixels = np.clip(base + rng.normal(0, 12, base.shape), 0, 255).astype(np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels, "RGB").save(buf, "JPEG", quality=90)
        out.append(buf.getvalue())
    return out


def run(stack: Stack, batches: int = 8, rounds: int = 5, warmup: int = 1) -> tuple[dict, str]:
    import torch
    from PIL import Image
    from sentence_transformers import SentenceTransformer, models

    from bench.harness.httpclient import HttpClient
    from tulip_rose_cli.launch import Ivy, Tulip

    torch.set_num_threads(stack.threads)
    scratch = Path(tempfile.mkdtemp(prefix="bench-image-embed-"))
    photos = _photos(batches * BATCH)
    groups = [photos[i * BATCH:(i + 1) * BATCH] for i in range(batches)]
    payloads = [{"input": [{"image": "data:image/jpeg;base64," + base64.b64encode(b).decode()} for b in g]}
                for g in groups]
    tulip = ivy = None
    try:
        model_dir = _clip_b32(scratch / "clip-vit-b32")
        st = SentenceTransformer(modules=[models.CLIPModel(str(model_dir))], device="cpu")
        tulip = Tulip(str(model_dir), log_dir=stack.log_dir, threads=stack.threads, timeout=900)
        ivy = Ivy([tulip.url], False, log_dir=stack.log_dir)
        client = HttpClient("127.0.0.1", ivy.port)
        requests = [client.prepare("/v1/embeddings", p) for p in payloads]

        def served(i: int) -> np.ndarray:
            status, body = client.send(requests[i % batches])
            assert status == 200, body[:300]
            return np.array([d["embedding"] for d in json.loads(body)["data"]], dtype=np.float32)

        def st_side(i: int) -> np.ndarray:
            images = [Image.open(io.BytesIO(b)) for b in groups[i % batches]]
            return st.encode(images, batch_size=BATCH, normalize_embeddings=True, convert_to_numpy=True)

        # The gate: every image of the first batch, between the two sides.
        stack.gates.append(gate.check("Ivy → Tulip images", served(0), st_side(0),
                                      "sentence-transformers CLIPModel (transformers' PIL processor)"))
        started = time.perf_counter()
        times = interleave({"ivy": served, "sentence-transformers": st_side}, rounds=rounds * batches,
                           warmup=warmup)
        wall = time.perf_counter() - started
    finally:
        if ivy is not None:
            ivy.stop()
        if tulip is not None:
            tulip.stop()
        shutil.rmtree(scratch, ignore_errors=True)
    per_side = {side: {"batch_p50_ms": float(np.median(s) * 1e3),
                       "images_per_second_median": float(BATCH / np.median(s)),
                       "images_per_second_mean": float(BATCH * len(s) / np.sum(s)), "batches": len(s)}
                for side, s in times.items()}
    speedup = ratio(per_side["ivy"]["images_per_second_median"],
                    per_side["sentence-transformers"]["images_per_second_median"])
    data = {"params": {"model": "CLIP ViT-B/32, random weights (224 px, 50 tokens an image)", "batch": BATCH,
                       "batches": batches, "rounds": rounds, "warmup_rounds": warmup, "threads": stack.threads,
                       "image": f"JPEG {SIZE[0]}x{SIZE[1]} quality 90, photo-like, seeded"},
            "sides": per_side, "ivy_over_st": speedup, "wall_seconds": round(wall, 1),
            "raw_seconds": {k: [round(x, 5) for x in v] for k, v in times.items()}}
    rows = [[side, f"{v['batch_p50_ms']:.1f}", f"{v['images_per_second_median']:.1f}",
             f"{v['images_per_second_mean']:.1f}"] for side, v in per_side.items()]
    md = "\n".join([
        f"{BATCH} JPEGs of {SIZE[0]}x{SIZE[1]} per request (Ivy: one `/v1/embeddings` call of `{{\"image\": data "
        f"URI}}` items; sentence-transformers: `encode` of the PIL images opened from the same bytes), "
        f"{rounds * batches} interleaved batches per side after {warmup} warm-up, {stack.threads} threads each, "
        "a random-weight CLIP ViT-B/32.",
        "",
        table(["side", "batch p50 (ms)", "images/s (median batch)", "images/s (all batches)"], rows),
        "",
        f"Ivy → Tulip / sentence-transformers, images/s of the median batch: **{speedup}×**.",
    ])
    return data, md


def plot(data: dict, path: Path) -> None:
    plots.throughput_bars({f"ViT-B/32, {data['params']['batch']} JPEGs a batch":
                           {s: v["images_per_second_median"] for s, v in data["sides"].items()}},
                          path, "Image embeddings on the CPU", ylabel="images / s (median batch)")


def options(scale: float) -> dict:
    return {"batches": 8, "rounds": scaled(5, scale)}
