"""Issue 48: images/s of image preparation on one CPU core, Ivy's
``ivy-imageprep`` crate against transformers' image processors, on the same
files and the same core.

The images are photos at upload sizes, written to a scratch folder and
removed afterwards: real photos that packages on this machine ship
(scikit-learn's ``china.jpg`` and ``flower.jpg``, matplotlib's
``grace_hopper.jpg``), the first as shipped, the others resized with
Lanczos to cover each size and centre-cropped, plus seeded Gaussian grain
(σ 2 levels, like a camera's sensor noise) so that an upscaled photo keeps
a photo's fine detail for the encoder, then encoded by Pillow (JPEG q90
4:2:0, PNG, lossy WebP q80). Without those packages, seeded smooth noise
and gradients stand in (the JSON says which).

Sides, each preparing from the encoded bytes (decode included):
- ``ivy-imageprep``: ``ImageProcessor::prepare`` in
  ``ivy/imageprep/examples/prep_rate.rs``, built by cargo
  (``--release -p ivy-imageprep --example prep_rate``) before any timing;
- ``transformers PIL``: ``PIL.Image.open`` on the bytes,
  ``ImageOps.exif_transpose`` (as transformers' ``load_image``), then the
  PIL-backed ("slow") processor (``CLIPImageProcessorPil``,
  ``SiglipImageProcessorPil``), ``return_tensors="np"``;
- ``transformers torchvision``: the same open, then the torchvision-backed
  ("fast") processor (``use_fast=True``), ``return_tensors="pt"``, when
  torchvision is installed.

Configs: CLIP ViT-B/16's (shortest edge 224, centre crop 224, bicubic) and
SigLIP's shape (224 x 224 exactly, bilinear), written from the templates of
``ivy/imageprep/tests/data/configs``.

Gate, before any timing: the Rust tensor of every image and config against
the PIL processor's, in 8-bit steps (rescale / std) as
``ivy/imageprep/tests/fidelity.rs`` counts them: none for PNG and WebP, and
for a JPEG at most 5, the bound fidelity.rs gives a decoded pixel (zune-jpeg
vs libjpeg-turbo, 4:2:0 chroma), plus 0.01 for the arithmetic. fidelity.rs
holds its fixtures to 3 steps once resizing has averaged neighbours; a mild
downscale averages less (the quick mode's 320x240 JPEG under CLIP, 1.07x
down, differs by 4), so each image's largest difference is reported against
3 as well. The torchvision processor resizes with torch's kernels,
not PIL's, so its difference from the PIL processor is reported, not gated.

Timing: this process and its children pinned to one core, torch on one
thread; in each of ``rounds`` blocks every side runs once (in a rotated
order), each image prepared again and again for at least ``min_seconds``;
a side's figure is the median of its blocks' images/s, and ratios are of
those medians."""

from __future__ import annotations

import io
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import plots
from bench.harness.results import REPO, table
from bench.harness.stack import Stack

TITLE = "Image preparation on one CPU core: ivy-imageprep (Rust) vs transformers' image processors"

RUST, SLOW, FAST = "ivy-imageprep", "transformers PIL", "transformers torchvision"

CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]
CONFIGS = {
    "clip": {"image_processor_type": "CLIPImageProcessor", "size": {"shortest_edge": 224},
             "crop_size": {"height": 224, "width": 224}, "resample": 3, "do_center_crop": True,
             "image_mean": CLIP_MEAN, "image_std": CLIP_STD},
    "siglip": {"image_processor_type": "SiglipImageProcessor", "size": {"height": 224, "width": 224},
               "resample": 2, "do_normalize": True, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
               "rescale_factor": 0.00392156862745098},
}

# name, source photo, (width, height) or None for the file as shipped, format, Pillow save options.
IMAGES = [
    ("photo_640x427.jpg", "china", None, "JPEG", {}),
    ("photo_640x480.jpg", "flower", (640, 480), "JPEG", {"quality": 90}),
    ("photo_1024x768.jpg", "china", (1024, 768), "JPEG", {"quality": 90}),
    ("photo_1920x1080.jpg", "flower", (1920, 1080), "JPEG", {"quality": 90}),
    ("phone_4032x3024.jpg", "china", (4032, 3024), "JPEG", {"quality": 90}),
    ("photo_800x600.png", "grace_hopper", (800, 600), "PNG", {}),
    ("photo_1024x768.webp", "flower", (1024, 768), "WEBP", {"quality": 80}),
]
QUICK_IMAGES = [
    ("photo_320x240.jpg", "flower", (320, 240), "JPEG", {"quality": 90}),
    ("photo_200x150.png", "grace_hopper", (200, 150), "PNG", {}),
    ("photo_256x192.webp", "china", (256, 192), "WEBP", {"quality": 80}),
]

GRAIN_SIGMA = 2.0


def options(scale: float) -> dict:
    return {"rounds": max(3, round(5 * scale)), "min_seconds": 0.25}


def quick_options() -> dict:
    """The test's run: three small images, one short block."""
    return {"rounds": 1, "min_seconds": 0.01, "images": QUICK_IMAGES}


# The images.

def _photo_paths() -> dict[str, Path]:
    """The real photos packages on this machine ship, by name."""
    found: dict[str, Path] = {}
    try:
        import sklearn.datasets

        base = Path(sklearn.datasets.__file__).parent / "images"
        found |= {n: base / f"{n}.jpg" for n in ("china", "flower") if (base / f"{n}.jpg").is_file()}
    except ImportError:
        pass
    try:
        import matplotlib

        p = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
        if p.is_file():
            found["grace_hopper"] = p
    except ImportError:
        pass
    return found


def _synthetic(w: int, h: int, seed: int):
    """A stand-in photo: seeded smooth noise (bilinearly upsampled from a
    coarse grid) over gradients."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    coarse = Image.fromarray(rng.integers(0, 256, (max(h // 32, 2), max(w // 32, 2), 3), dtype=np.uint8))
    smooth = np.asarray(coarse.resize((w, h), Image.Resampling.BICUBIC), dtype=np.float64)
    y, x = np.mgrid[0:h, 0:w]
    grad = np.stack([x / w, y / h, (x + y) / (w + h)], -1) * 96
    return Image.fromarray(np.clip(smooth * 0.7 + grad, 0, 255).astype(np.uint8))


def _cover(im, w: int, h: int):
    """Resized (Lanczos) to cover ``w`` x ``h``, centre-cropped to it."""
    from PIL import Image

    s = max(w / im.width, h / im.height)
    rw, rh = max(w, round(im.width * s)), max(h, round(im.height * s))
    im = im.resize((rw, rh), Image.Resampling.LANCZOS)
    left, top = (rw - w) // 2, (rh - h) // 2
    return im.crop((left, top, left + w, top + h))


def make_images(folder: Path, specs: list) -> list[dict]:
    """Writes each image of ``specs`` into ``folder``; returns what each is."""
    from PIL import Image

    photos = _photo_paths()
    out = []
    for seed, (name, source, size, fmt, save) in enumerate(specs):
        path = folder / name
        real = source in photos
        if real and size is None:
            shutil.copyfile(photos[source], path)
            how = f"{photos[source].name} as shipped"
        else:
            w, h = size or (640, 427)
            if real:
                im = _cover(Image.open(photos[source]).convert("RGB"), w, h)
                grain = np.random.default_rng(seed).normal(0, GRAIN_SIGMA, (h, w, 3))
                im = Image.fromarray(np.clip(np.asarray(im, dtype=np.float64) + grain, 0, 255).round()
                                     .astype(np.uint8))
                how = f"{photos[source].name}, Lanczos to cover {w}x{h}, centre crop, grain σ {GRAIN_SIGMA}"
            else:
                im = _synthetic(w, h, seed)
                how = f"synthetic (seeded smooth noise and gradients, seed {seed}) {w}x{h}"
            im.save(path, fmt, **save)
            how += f", {fmt} {json.dumps(save)}" if save else f", {fmt}"
        with Image.open(path) as im:
            width, height, mode = im.width, im.height, im.mode
        out.append({"name": name, "path": str(path), "source": how, "real_photo": real, "format": fmt,
                    "width": width, "height": height, "mode": mode, "encoded_bytes": path.stat().st_size})
    return out


# The sides.

def rust_program() -> tuple[Path, str]:
    """Builds (or finds built) the example; its path and the cargo command."""
    cmd = ["cargo", "build", "--release", "-p", "ivy-imageprep", "--example", "prep_rate",
           "--message-format=json-render-diagnostics"]
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
    for line in res.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") == "compiler-artifact" and msg["target"]["name"] == "prep_rate" and msg.get("executable"):
            return Path(msg["executable"]), " ".join(cmd[:-1])
    raise RuntimeError("cargo built no prep_rate executable")


def run_rust(program: Path, config: Path, images: list[dict], rounds: int, min_seconds: float,
             dump: Path | None = None) -> list[dict]:
    cmd = [str(program), str(config), "--rounds", str(rounds), "--min-seconds", str(min_seconds)]
    if dump is not None:
        cmd += ["--dump", str(dump)]
    res = subprocess.run(cmd + [i["path"] for i in images], capture_output=True, text=True, timeout=1800)
    if res.returncode != 0:
        raise RuntimeError(f"prep_rate failed: {res.stderr[-2000:]}")
    return json.loads(res.stdout)["images"]


def processors(config: dict) -> dict:
    """The transformers processors of ``config``: PIL always, torchvision if installed."""
    from transformers import CLIPImageProcessorPil, SiglipImageProcessorPil

    kind = config["image_processor_type"]
    slow = {"CLIPImageProcessor": CLIPImageProcessorPil, "SiglipImageProcessor": SiglipImageProcessorPil}[kind]
    out = {SLOW: (slow.from_dict(config), "np")}
    if torchvision_version():
        # transformers 5: the class without a suffix is the torchvision backend
        # (what use_fast=True chose before), PIL's a fallback without torchvision.
        from transformers import CLIPImageProcessor, SiglipImageProcessor
        from transformers.image_processing_backends import TorchvisionBackend

        fast = {"CLIPImageProcessor": CLIPImageProcessor, "SiglipImageProcessor": SiglipImageProcessor}[kind]
        proc = fast.from_dict(config)
        if isinstance(proc, TorchvisionBackend):
            out[FAST] = (proc, "pt")
    return out


def torchvision_version() -> str | None:
    try:
        import torchvision

        return torchvision.__version__
    except ImportError:
        return None


def prepare_py(proc, tensors: str, data: bytes):
    from PIL import Image, ImageOps

    im = Image.open(io.BytesIO(data))
    ImageOps.exif_transpose(im, in_place=True)
    return proc(im, return_tensors=tensors)["pixel_values"]


def time_py(proc, tensors: str, data: bytes, min_seconds: float) -> tuple[float, int]:
    """Images/s of one block: prepared again and again for ``min_seconds``."""
    n, start = 0, time.perf_counter()
    while True:
        prepare_py(proc, tensors, data)
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= min_seconds:
            return n / elapsed, n


def steps(config: dict) -> np.ndarray:
    """One 8-bit level in normalised units, per channel (fidelity.rs)."""
    return np.asarray(config.get("rescale_factor", 1 / 255)) / np.asarray(config["image_std"])


def compare(got: np.ndarray, want: np.ndarray, config: dict) -> dict:
    got, want = got.reshape(3, -1).astype(np.float64), want.reshape(3, -1).astype(np.float64)
    diff = (got - want) / steps(config)[:, None]
    return {"max_steps": round(float(np.abs(diff).max()), 4), "mean_abs_steps": round(float(np.abs(diff).mean()), 4),
            "mean_steps": round(float(diff.mean()), 4), "max_abs": float(np.abs(got - want).max()),
            "differing": int((got != want).sum()), "values": int(got.size)}


def allowed_steps(image: dict) -> float:
    """The gate: a decoded JPEG pixel may differ by 5 levels (zune-jpeg vs
    libjpeg-turbo, 4:2:0), and a mild downscale averages little of it away."""
    return 5.0 if image["format"] == "JPEG" else 0.0


def fidelity_steps(image: dict) -> float:
    """fidelity.rs's bound on its fixtures, reported against."""
    return 3.0 if image["format"] == "JPEG" else 0.0


def cpu_times() -> dict[str, tuple[int, int]]:
    """Per CPU of /proc/stat: (busy, total) jiffies."""
    out = {}
    try:
        for line in Path("/proc/stat").read_text().splitlines():
            if line.startswith("cpu") and line[3:4].isdigit():
                name, *v = line.split()
                t = [int(x) for x in v[:8]]
                out[name] = (sum(t) - t[3] - t[4], sum(t))
    except OSError:
        pass
    return out


def busy_fractions(before: dict, after: dict) -> dict[str, float]:
    """How busy each CPU was between two ``cpu_times``: the pinned one runs
    the sides; the others show what else ran on the machine meanwhile."""
    return {c: round((after[c][0] - b[0]) / max(after[c][1] - b[1], 1), 3) for c, b in before.items() if c in after}


# The run.

def run(stack: Stack, rounds: int = 5, min_seconds: float = 0.25, images: list | None = None) -> tuple[dict, str]:
    import torch

    program, build = rust_program()  # before pinning: cargo may compile
    torch.set_num_threads(1)
    scratch = Path(tempfile.mkdtemp(prefix="bench-image-prep-"))
    saved_cpus = os.sched_getaffinity(0)
    cpu = min(saved_cpus)
    load_before = list(os.getloadavg())
    try:
        files = make_images(scratch, images or IMAGES)
        blobs = {f["name"]: Path(f["path"]).read_bytes() for f in files}
        configs = {}
        for name, cfg in CONFIGS.items():
            configs[name] = scratch / f"{name}.json"
            configs[name].write_text(json.dumps(cfg))
        procs = {name: processors(cfg) for name, cfg in CONFIGS.items()}
        sides = [RUST, *procs["clip"]]
        os.sched_setaffinity(0, {cpu})  # the Rust program inherits it

        # Gate: the same tensors, before any timing.
        agreement: dict = {}
        for name, cfg in CONFIGS.items():
            dump = scratch / f"dump-{name}"
            dump.mkdir()
            rust = run_rust(program, configs[name], files, 0, 0.0, dump)
            for i, f in enumerate(files):
                got = np.fromfile(dump / f"{i}.f32", dtype="<f4")
                slow_proc, slow_t = procs[name][SLOW]
                want = np.asarray(prepare_py(slow_proc, slow_t, blobs[f["name"]]))[0]
                if list(want.shape) != rust[i]["shape"]:
                    raise RuntimeError(f"{f['name']} {name}: shape {rust[i]['shape']} vs {list(want.shape)}")
                cell = {RUST: {**compare(got, want, cfg), "allowed_steps": allowed_steps(f),
                               "fidelity_rs_steps": fidelity_steps(f),
                               "sum": rust[i]["sum"], "reference_sum": float(want.astype(np.float64).sum())}}
                cell[RUST]["passed"] = cell[RUST]["max_steps"] <= allowed_steps(f) + 0.01
                if FAST in procs[name]:
                    fast_proc, fast_t = procs[name][FAST]
                    fast = prepare_py(fast_proc, fast_t, blobs[f["name"]])[0].numpy()
                    cell[FAST] = compare(fast, want, cfg)
                agreement.setdefault(name, {})[f["name"]] = cell
            cells = [(f, agreement[name][f["name"]][RUST]) for f in files]
            jpeg = [c["max_steps"] for f, c in cells if f["format"] == "JPEG"]
            rest = [c["max_steps"] for f, c in cells if f["format"] != "JPEG"]
            check = ", ".join([*([f"JPEG max {max(jpeg):.2f} 8-bit steps (allowed 5; fidelity.rs 3)"] if jpeg else []),
                               *([f"others max {max(rest):.2f} (allowed 0)"] if rest else [])])
            record = {"side": f"{RUST} ({name})", "reference": type(procs[name][SLOW][0]).__name__,
                      "rows": len(files), "check": check, "passed": all(c["passed"] for _, c in cells)}
            stack.gates.append(record)
            if not record["passed"]:
                raise RuntimeError(f"gate failed for {name}: {json.dumps(agreement[name], indent=1)}")

        # Timing: blocks, sides in a rotated order within each.
        times_before = cpu_times()
        per_round: dict = {n: {f["name"]: {s: [] for s in sides} for f in files} for n in CONFIGS}
        for block in range(rounds):
            order = sides[block % len(sides):] + sides[:block % len(sides)]
            for side in order:
                for name in CONFIGS:
                    if side == RUST:
                        for f, r in zip(files, run_rust(program, configs[name], files, 1, min_seconds)):
                            per_round[name][f["name"]][RUST].append(r["rounds_images_per_s"][0])
                    else:
                        proc, t = procs[name][side]
                        for f in files:
                            prepare_py(proc, t, blobs[f["name"]])  # warm
                            per_round[name][f["name"]][side].append(time_py(proc, t, blobs[f["name"]],
                                                                            min_seconds)[0])
        busy = busy_fractions(times_before, cpu_times())
    finally:
        os.sched_setaffinity(0, saved_cpus)
        shutil.rmtree(scratch, ignore_errors=True)

    medians = {n: {f: {s: statistics.median(v) for s, v in by_side.items()} for f, by_side in by_file.items()}
               for n, by_file in per_round.items()}
    ratios = {n: {f: {f"{RUST} / {s}": m[RUST] / m[s] for s in sides if s != RUST} for f, m in by_file.items()}
              for n, by_file in medians.items()}
    from importlib import metadata

    data = {
        "params": {
            "rounds": rounds, "min_seconds_per_block": min_seconds, "cpu_pinned": cpu, "torch_threads": 1,
            "sides": sides, "configs": CONFIGS,
            "images": [{k: v for k, v in f.items() if k != "path"} for f in files],
            "rust_build": build, "rust_profile": "release",
            "pillow": metadata.version("pillow"), "torchvision": torchvision_version(),
            "processors": {n: {s: type(p).__name__ for s, (p, _) in ps.items()} for n, ps in procs.items()},
            "loadavg_before": load_before, "loadavg_after": list(os.getloadavg()),
            "cpu_busy_while_timing": busy,
        },
        "images_per_second": medians,
        "ratios": ratios,
        "rounds_images_per_second": per_round,
        "agreement": agreement,
    }
    return data, markdown(data)


def markdown(data: dict) -> str:
    p = data["params"]
    sides = p["sides"]
    others = [s for s in sides if s != RUST]
    lines = [
        f"Images/s preparing one image from its encoded bytes (decode, resize, crop, rescale, normalise) on "
        f"CPU {p['cpu_pinned']} alone, torch on 1 thread; median of {p['rounds']} blocks of at least "
        f"{p['min_seconds_per_block']} s per image and side, sides in a rotated order per block. Rust: "
        f"`{p['rust_build']}` (`ImageProcessor::prepare`). Python: `PIL.Image.open` on the bytes, "
        f"`ImageOps.exif_transpose`, then the processor ({', '.join(others)}). Load average "
        f"{p['loadavg_before'][0]:.2f} before, {p['loadavg_after'][0]:.2f} after; while timing, each CPU's busy "
        f"fraction (/proc/stat): " + ", ".join(f"{c} {b:.2f}" for c, b in p["cpu_busy_while_timing"].items()) + ".",
        "",
        "Images: " + "; ".join(f"`{i['name']}` ({i['source']}, {i['encoded_bytes']:,} bytes)" for i in p["images"])
        + ".",
    ]
    if FAST not in sides:
        lines += ["", "torchvision is not installed: transformers' torchvision-backed processor was not timed."]
    for name, by_file in data["images_per_second"].items():
        cfg = p["configs"][name]
        lines += ["", f"## {name}: {json.dumps(cfg['size'])}"
                  + (f", crop {json.dumps(cfg['crop_size'])}" if cfg.get("do_center_crop") else "")
                  + f", resample {cfg['resample']} ({'bicubic' if cfg['resample'] == 3 else 'bilinear'})", ""]
        rows = []
        for f, m in by_file.items():
            agree = data["agreement"][name][f]
            row = [f, *(f"{m[s]:.1f}" for s in sides),
                   *(f"{data['ratios'][name][f][f'{RUST} / {s}']:.2f}×" for s in others),
                   f"{agree[RUST]['max_steps']:.2f}"]
            if FAST in sides:
                row.append(f"{agree[FAST]['max_steps']:.2f}")
            rows.append(row)
        head = ["image", *(f"{s} images/s" for s in sides), *(f"{RUST} / {s}" for s in others),
                f"{RUST} vs PIL, max 8-bit steps"]
        if FAST in sides:
            head.append("torchvision vs PIL, max 8-bit steps")
        lines.append(table(head, rows))
    lines += ["", "Agreement is in 8-bit steps of the normalised value (rescale / std), as "
              "ivy/imageprep/tests/fidelity.rs counts: the Rust tensors are gated against the PIL processor's "
              "(JPEG ≤ 5 steps, the decoders' bound, other formats 0; fidelity.rs holds its fixtures' JPEGs to 3 "
              "steps after resizing); the torchvision processor resizes with torch's kernels and is "
              "reported, not gated."]
    return "\n".join(lines)


def plot(data: dict, path: Path) -> Path:
    """Images/s per image, one bar per side, one panel per config."""
    plt = plots._plt()
    configs = list(data["images_per_second"])
    sides = data["params"]["sides"]
    fig, axes = plt.subplots(1, len(configs), figsize=(6 * len(configs), 4.5), sharey=True)
    for ax, name in zip(np.atleast_1d(axes), configs):
        by_file = data["images_per_second"][name]
        x = np.arange(len(by_file))
        width = 0.8 / len(sides)
        for k, side in enumerate(sides):
            ax.bar(x + (k - (len(sides) - 1) / 2) * width, [m[side] for m in by_file.values()], width,
                   label=side, color=f"C{k}")
        ax.set_xticks(x, [f.split(".")[0].replace("_", "\n") + "\n" + f.split(".")[1] for f in by_file],
                      fontsize=7)
        ax.set_yscale("log")
        cfg = data["params"]["configs"][name]
        how = (f"shortest edge {cfg['size']['shortest_edge']}, crop {cfg['crop_size']['height']}"
               if "shortest_edge" in cfg["size"] else f"{cfg['size']['height']} x {cfg['size']['width']}")
        ax.set_title(f"{name} ({how}, {'bicubic' if cfg['resample'] == 3 else 'bilinear'})", fontsize=10)
        ax.grid(axis="y", alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("images/s, one core (log)")
    np.atleast_1d(axes)[0].legend(fontsize=8)
    fig.suptitle("Image preparation from encoded bytes, one CPU core", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
