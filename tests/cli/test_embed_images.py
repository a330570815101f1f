"""``tulip-rose embed --image-column NAME`` against a real Tulip and Ivy on
the tiny served CLIP (issue 48): image paths in JSONL and CSV and image
bytes in Parquet embed to the vectors ``/v1/embeddings`` answers for the
same bytes, in input order, across batches and requests split by
``--image-request-bytes``; a missing file, a corrupt image, a file that is
no image, an empty value and an image over the request bound are bad rows
while the others are embedded, and a run stopped by ``--strict`` resumes;
a text-only model, a text file and ``--column`` with ``--image-column``
are refused before anything is written."""

from __future__ import annotations

import base64
import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from bench.harness.tiny_models import tiny_dual_encoder
from tests.support.http import embed
from tests.support.servers import REPO, Ivy, Tulip
from tulip_rose_cli.images import item

pytestmark = pytest.mark.slow


def picture(kind: str, seed: int, size: tuple[int, int] = (40, 30)) -> bytes:
    """A small photo-like image (gradients and noise) encoded as ``kind``."""
    from PIL import Image

    w, h = size
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:h, 0:w]
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 127 / (w + h)], axis=-1)
    pixels = np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8)
    out = io.BytesIO()
    image = Image.fromarray(pixels, "RGB")
    (image.convert("P") if kind == "GIF" else image).save(out, kind)
    return out.getvalue()


# name → bytes: every format Ivy reads, the images differing.
IMAGES = {f"im{i}.{kind.lower()}": picture(kind, i) for i, kind in
          enumerate(["PNG", "JPEG", "WEBP", "GIF", "PNG", "JPEG", "PNG"])}


def data_uri(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tulip_rose_cli", "embed", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


def read(out: Path) -> tuple[list, np.ndarray]:
    t = pq.read_table(out)
    return t.column("id").to_pylist(), np.array(t.column("embedding").to_pylist(), dtype=np.float32)


def errors(out: Path) -> list[dict]:
    return [json.loads(line) for line in out.with_name(out.name + ".errors.jsonl").read_text().splitlines()]


def assert_close(got: np.ndarray, want: np.ndarray) -> None:
    assert got.shape == want.shape, (got.shape, want.shape)
    cos = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cos.min() >= 0.999, cos


def image_requests(ivy: Ivy) -> float:
    return sum(v for k, v in ivy.metrics().items()
               if k.startswith("ivy_requests_total{") and 'endpoint="embeddings"' in k)


@pytest.fixture(scope="module")
def clip(tmp_path_factory, log_dir):
    d = tiny_dual_encoder(tmp_path_factory.mktemp("clip") / "m", seed=0, served=True)
    tulip = Tulip(str(d), log_dir=log_dir, threads=1)
    try:
        ivy = Ivy([tulip.url], False, log_dir=log_dir)
    except BaseException:
        tulip.stop()
        raise
    yield ivy
    ivy.stop()
    tulip.stop()


@pytest.fixture(scope="module")
def images(tmp_path_factory, clip) -> tuple[Path, dict[str, np.ndarray]]:
    """The images as files in ``pics/`` and Ivy's own vector of each."""
    d = tmp_path_factory.mktemp("images")
    (d / "pics").mkdir()
    for name, data in IMAGES.items():
        (d / "pics" / name).write_bytes(data)
    want = embed(clip, [{"image": data_uri(b)} for b in IMAGES.values()])
    return d, dict(zip(IMAGES, want))


@pytest.mark.parametrize("fmt", ["jsonl", "csv"])
def test_image_paths_give_ivys_vectors_in_order(clip, images, fmt):
    """Relative paths (from the input's directory) and an absolute one, in
    batches of 3 across 7 rows."""
    d, want = images
    names = list(IMAGES)
    paths = [f"pics/{n}" if i % 2 else str(d / "pics" / n) for i, n in enumerate(names)]
    src, out = d / f"rows.{fmt}", d / f"{fmt}.parquet"
    if fmt == "jsonl":
        src.write_text("".join(json.dumps({"key": f"k{i}", "photo": p}) + "\n" for i, p in enumerate(paths)))
    else:
        with open(src, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["key", "photo"])
            w.writerows([f"k{i}", p] for i, p in enumerate(paths))
    proc = cli(src, "--out", out, "--url", clip.url, "--image-column", "photo", "--id-column", "key",
               "--batch-size", 3, "--overwrite")
    assert proc.returncode == 0, proc.stderr
    ids, got = read(out)
    assert ids == [f"k{i}" for i in range(len(names))]
    assert_close(got, np.stack([want[n] for n in names]))


def test_parquet_image_bytes_in_requests_under_the_byte_bound(clip, images):
    """A binary column; ``--image-request-bytes`` a little over the largest
    image, so a batch of 4 goes in several requests, each as full as the
    bound lets it be, in order."""
    d, want = images
    src, out = d / "bytes.parquet", d / "bytes-out.parquet"
    pq.write_table(pa.table({"img": pa.array(list(IMAGES.values()), pa.binary())}), src)
    largest = max(len(base64.b64encode(b)) for b in IMAGES.values()) + 30
    before = image_requests(clip)
    proc = cli(src, "--out", out, "--url", clip.url, "--image-field", "img", "--batch-size", 4,
               "--image-request-bytes", largest)
    assert proc.returncode == 0, proc.stderr
    ids, got = read(out)
    assert ids == list(range(1, len(IMAGES) + 1))
    assert_close(got, np.stack(list(want.values())))
    sizes = [len(item(b, largest)) for b in IMAGES.values()]
    requests = 0
    for batch in (sizes[:4], sizes[4:]):
        used = 0
        for n in batch:
            if used == 0 or used + n > largest:
                requests, used = requests + 1, 0
            used += n
    assert requests > 2  # the bound split the batches
    # Those requests, and the probe before the run.
    assert image_requests(clip) - before == requests + 1


def test_bad_images_are_bad_rows_and_a_strict_stop_resumes(clip, images):
    """Missing, corrupt, not an image, empty, over the bound: each its own
    row's error with its reason; the other rows are Ivy's vectors. A
    ``--strict`` run stops at the first bad batch and the same command
    without it resumes from the batches kept."""
    d, want = images
    (d / "pics" / "corrupt.png").write_bytes(IMAGES["im0.png"][:60])
    (d / "pics" / "notes.png").write_bytes(b"this is a text file, not an image\n" * 4)
    big = picture("PNG", 99, (300, 300))
    (d / "pics" / "big.png").write_bytes(big)
    rows = ["pics/im1.jpeg", "pics/im2.webp", "pics/im4.png", "pics/missing.png",  # batch 0 good
            "pics/corrupt.png", "pics/im0.png", "pics/notes.png", "", "pics/big.png", data_uri(IMAGES["im6.png"])]
    src, out = d / "bad.jsonl", d / "bad.parquet"
    src.write_text("".join(json.dumps({"image": r}) + "\n" for r in rows))
    bound = ["--image-request-bytes", 4 * len(big) // 3 - 100]
    assert max(len(b) for b in IMAGES.values()) * 4 // 3 + 30 < bound[1]
    strict = cli(src, "--out", out, "--url", clip.url, "--image-column", "image", "--batch-size", 3,
                 *bound, "--strict", "--concurrency", 1)
    assert strict.returncode == 1, strict.stderr
    proc = cli(src, "--out", out, "--url", clip.url, "--image-column", "image", "--batch-size", 3, *bound)
    assert proc.returncode == 5, proc.stderr
    assert "resuming: 2 batches" in proc.stderr  # the good one and the first bad one
    ids, got = read(out)
    assert ids == [1, 2, 3, 6, 10]
    assert_close(got, np.stack([want[n] for n in ["im1.jpeg", "im2.webp", "im4.png", "im0.png", "im6.png"]]))
    bad = {e["row"]: e for e in errors(out)}
    assert sorted(bad) == [4, 5, 7, 8, 9]
    assert bad[4]["error"] == f"no image file {d / 'pics' / 'missing.png'}"
    assert bad[4]["line"] == 4
    assert "HTTP 422" in bad[5]["error"] and "input[0]" in bad[5]["error"], bad[5]
    assert "HTTP 415" in bad[7]["error"], bad[7]
    assert bad[8]["error"] == "empty"
    assert "--image-request-bytes" in bad[9]["error"], bad[9]


def test_image_runs_refused_before_anything_is_written(clip, ivy_minilm, images, tmp_path):
    """A text-only model (found by the probe), a text file, and both
    columns at once: exit 2, a clear message, no file."""
    d, _ = images
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps({"image": str(d / "pics" / "im0.png"), "text": "a cat"}) + "\n")
    out = tmp_path / "out.parquet"
    text_model = cli(src, "--out", out, "--url", ivy_minilm.url, "--image-column", "image")
    assert text_model.returncode == 2, text_model.stderr
    assert "takes text only" in text_model.stderr and "--image-column" in text_model.stderr
    txt = tmp_path / "rows.txt"
    txt.write_text("pics/im0.png\n")
    no_columns = cli(txt, "--out", out, "--url", clip.url, "--image-column", "image")
    assert no_columns.returncode == 2 and "no image column" in no_columns.stderr, no_columns.stderr
    both = cli(src, "--out", out, "--url", clip.url, "--image-column", "image", "--column", "text")
    assert both.returncode == 2 and "not both" in both.stderr, both.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rows.jsonl", "rows.txt"]
