"""Fixtures for ivy-imageprep's fidelity tests: small seeded images in every
format the gateway decodes, three preprocessor configs, and what
transformers' PIL-backed ("slow") image processors make of each pair.

    .venv/bin/python -m bench.harness.image_fixtures [OUT]

OUT defaults to ivy/imageprep/tests/data. It receives images/, configs/,
expected/<image>__<config>.f32 (little-endian float32, CHW) and cases.json,
the manifest the Rust tests read. Everything is deterministic: rerunning
with the same Pillow and transformers rewrites identical files.

The reference is what a Python user gets from the encoded bytes: PIL opens
them (a GIF's first frame), ``ImageOps.exif_transpose`` applies the EXIF
orientation (as transformers' ``load_image`` does), and the processor does
the rest, alpha composited onto white included.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps, features
from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUT = REPO / "ivy" / "imageprep" / "tests" / "data"

PROCESSORS = {"CLIPImageProcessor": CLIPImageProcessorPil, "CLIPFeatureExtractor": CLIPImageProcessorPil,
              "SiglipImageProcessor": SiglipImageProcessorPil}

# Output sizes are small and deliberately not square, so a height/width swap
# or an off-by-one crop offset shows.
CONFIGS = {
    # CLIP's shape: shortest edge, then a centre crop; bicubic.
    "clip": {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 20},
             "crop_size": {"height": 18, "width": 15}, "resample": 3, "do_center_crop": True,
             "image_mean": [0.48145466, 0.4578275, 0.40821073],
             "image_std": [0.26862954, 0.26130258, 0.27577711]},
    # The legacy spelling (openai/clip-vit-*): integer size and crop_size,
    # class defaults for everything unsaid; upscales the smaller images.
    "clip_legacy": {"feature_extractor_type": "CLIPFeatureExtractor", "size": 72, "crop_size": 24,
                    "resample": 3},
    # SigLIP's shape: a fixed height x width, no crop; bilinear here.
    "siglip": {"image_processor_type": "SiglipImageProcessor", "size": {"height": 24, "width": 19},
               "resample": 2, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5],
               "image_std": [0.5, 0.5, 0.5], "rescale_factor": 0.00392156862745098},
}


def _rgb(w: int, h: int, seed: int, noise: int = 48) -> np.ndarray:
    """Gradients plus seeded noise: smooth enough to compress, rough enough
    that every filter tap matters."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([255 * x / max(w - 1, 1), 255 * y / max(h - 1, 1), 127 + 120 * np.sin((x + 2 * y) / 5)], -1)
    return np.clip(base + rng.integers(-noise, noise + 1, (h, w, 3)), 0, 255).astype(np.uint8)


def _encode(im: Image.Image, fmt: str, **kw) -> bytes:
    buf = io.BytesIO()
    im.save(buf, fmt, **kw)
    return buf.getvalue()


def _exif(orientation: int) -> Image.Exif:
    exif = Image.Exif()
    exif[0x0112] = orientation
    return exif


def images() -> dict[str, bytes]:
    out = {}
    out["noise_37x53.png"] = _encode(Image.fromarray(_rgb(37, 53, 1)), "PNG")
    # A 6x downscale: the filter support widens with the scale (antialiasing).
    out["wide_120x80.png"] = _encode(Image.fromarray(_rgb(120, 80, 2, noise=24)), "PNG")
    alpha = np.tile(np.linspace(0, 255, 64).round().astype(np.uint8), (64, 1))
    alpha[:8] = 0  # fully transparent rows: colour must not leak through
    alpha[-8:] = 255
    out["alpha_64x64.png"] = _encode(Image.fromarray(np.dstack([_rgb(64, 64, 3), alpha]), "RGBA"), "PNG")
    out["gray_40x30.png"] = _encode(Image.fromarray(_rgb(40, 30, 4)[..., 0], "L"), "PNG")
    pal = Image.fromarray(_rgb(24, 24, 5)).quantize(16)
    out["palette_trns_24x24.png"] = _encode(pal, "PNG", transparency=3)
    out["exif8_30x20.png"] = _encode(Image.fromarray(_rgb(30, 20, 6)), "PNG", exif=_exif(8))
    out["exif6_48x32.jpg"] = _encode(Image.fromarray(_rgb(48, 32, 7, noise=16)), "JPEG", quality=95,
                                     exif=_exif(6))
    out["q90_50x40.jpg"] = _encode(Image.fromarray(_rgb(50, 40, 8, noise=16)), "JPEG", quality=90)
    out["q90_444_50x40.jpg"] = _encode(Image.fromarray(_rgb(50, 40, 8, noise=16)), "JPEG", quality=90,
                                       subsampling=0)
    frames = [Image.fromarray(_rgb(30, 20, 9 + i)).quantize(64) for i in range(2)]
    out["two_frames_30x20.gif"] = _encode(frames[0], "GIF", save_all=True, append_images=frames[1:],
                                          duration=100, loop=0)
    if features.check("webp"):
        out["lossy_50x40.webp"] = _encode(Image.fromarray(_rgb(50, 40, 10, noise=16)), "WEBP", quality=90)
        rgba = np.dstack([_rgb(50, 40, 11), np.tile(np.linspace(0, 255, 50).astype(np.uint8), (40, 1))])
        out["lossless_alpha_50x40.webp"] = _encode(Image.fromarray(rgba, "RGBA"), "WEBP", lossless=True)
        out["exif3_lossless_32x24.webp"] = _encode(Image.fromarray(_rgb(32, 24, 12)), "WEBP", lossless=True,
                                                   exif=_exif(3))
    return out


def reference(data: bytes, config: dict) -> np.ndarray:
    kind = config.get("image_processor_type") or config["feature_extractor_type"]
    processor = PROCESSORS[kind].from_dict(config)
    with Image.open(io.BytesIO(data)) as im:
        upright = ImageOps.exif_transpose(im)
        return processor(images=upright, return_tensors="np")["pixel_values"][0]


def main(out: Path) -> None:
    for sub in ("images", "configs", "expected"):
        (out / sub).mkdir(parents=True, exist_ok=True)
    cases = []
    for cname, config in CONFIGS.items():
        (out / "configs" / f"{cname}.json").write_text(json.dumps(config, indent=2) + "\n")
    for iname, data in images().items():
        (out / "images" / iname).write_bytes(data)
        for cname, config in CONFIGS.items():
            pixels = reference(data, config).astype("<f4")
            name = f"{iname}__{cname}.f32"
            (out / "expected" / name).write_bytes(pixels.tobytes())
            cases.append({"image": iname, "config": cname, "expected": name, "shape": list(pixels.shape)})
    manifest = {"pillow": Image.__version__, "transformers": __import__("transformers").__version__,
                "cases": cases}
    (out / "cases.json").write_text(json.dumps(manifest, indent=1) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT)
