"""Issue 15, item 4: bulk embedding of a 20,000-document real-text file with
the ``tulip-rose embed`` command (a subprocess, through Ivy's HTTP API to
Tulip, as a user runs it: start-up, reading, resumable batches and the
final ``.npy`` included) against ``sentence-transformers`` ``encode`` of the
same documents in-process, in alternating rounds of the same run, in
documents per second. The two outputs must agree row by row, in order."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench.harness import inputs, plots
from bench.harness.results import REPO, table
from bench.harness.stack import Stack
from bench.harness.timing import ratio, scaled

TITLE = "Bulk embedding of a real-text file: `tulip-rose embed` through Ivy vs sentence-transformers encode"


def documents(n: int) -> tuple[list[str], str]:
    """``n`` real English lines (botchan.txt's body), repeated in order as
    often as needed; and a sentence saying how often."""
    src = inputs.english_lines()
    docs = [src[i % len(src)] for i in range(n)]
    return docs, (f"{n:,} documents: the {len(src):,} non-empty lines of botchan.txt's body in file order"
                  + (f", repeated {n / len(src):.1f} times" if n > len(src) else ""))


def _command(src: Path, out: Path, url: str, extra: list[str]) -> tuple[float, str]:
    """Runs ``tulip-rose embed``; (wall seconds, its last stderr line)."""
    cmd = [sys.executable, "-m", "tulip_rose_cli", "embed", str(src), "--out", str(out), "--url", url,
           "--overwrite", *extra]
    start = time.perf_counter()
    res = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=3600)
    wall = time.perf_counter() - start
    if res.returncode != 0:
        raise RuntimeError(f"tulip-rose embed exited {res.returncode}: {res.stderr[-2000:]}")
    lines = res.stderr.strip().splitlines()
    return wall, next((x for x in reversed(lines) if x.startswith("embedded ")), "")


def run(stack: Stack, docs: int = 20000, rounds: int = 2, warmup: int = 256,
        st_batch: int = 32) -> tuple[dict, str]:
    texts, provenance = documents(docs)
    tok = inputs.tokenizer(stack.model_dir, stack.max_length)
    tokens = sum(len(e.ids) for e in tok.encode_batch(texts))
    ivy, st = stack.ivy(), stack.st()
    work = Path(tempfile.mkdtemp(prefix="bench-bulk-"))
    src = work / "docs.txt"
    src.write_text("".join(t + "\n" for t in texts), encoding="utf-8")
    (work / "warm.txt").write_text("".join(t + "\n" for t in texts[:warmup]), encoding="utf-8")
    out = work / "vectors.npy"

    _command(work / "warm.txt", out, ivy.url, [])
    st.encode(texts[:warmup], batch_size=st_batch)
    rates: dict[str, list[float]] = {"tulip-rose embed": [], "sentence-transformers": []}
    progress_lines, got, want = [], None, None
    for r in range(rounds):
        order = list(rates) if r % 2 == 0 else list(reversed(rates))
        for side in order:
            if side == "tulip-rose embed":
                wall, line = _command(src, out, ivy.url, [])
                progress_lines.append(line)
                got = np.load(out)
            else:
                start = time.perf_counter()
                want = st.encode(texts, batch_size=st_batch)
                wall = time.perf_counter() - start
            rates[side].append(docs / wall)
            print(f"round {r + 1}, {side}: {docs / wall:,.1f} docs/s", flush=True)

    ids = [int(x) for x in (work / "vectors.ids.jsonl").read_text().split()]
    in_order = ids == list(range(1, docs + 1))
    cos = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    deviation = float(1.0 - cos.min())
    best = {k: round(max(v), 2) for k, v in rates.items()}
    speedup = ratio(best["tulip-rose embed"], best["sentence-transformers"])
    data = {
        "params": {"docs": docs, "tokens": tokens, "rounds": rounds, "warmup_docs": warmup,
                   "st_batch_size": st_batch, "threads": stack.threads, "input": provenance,
                   "command": "tulip-rose embed docs.txt --out vectors.npy --url IVY (defaults: batch 64, "
                              "2 requests in flight per replica)",
                   "stack": "one Tulip replica (torch threads as above) behind one Ivy, same machine"},
        "docs_per_s": {k: [round(x, 2) for x in v] for k, v in rates.items()},
        "best_docs_per_s": best,
        "tokens_per_s_best": {k: round(v * tokens / docs, 1) for k, v in best.items()},
        "ratio_cli_over_st": speedup,
        "target_ratio": 1.0,
        "target_met": speedup is not None and speedup >= 1.0,
        "rows_in_input_order": in_order,
        "max_cosine_deviation": deviation,
        "cli_last_progress_lines": progress_lines,
    }
    md = "\n".join([
        f"{provenance}; {tokens:,} tokens with special tokens (truncated at {stack.max_length}). "
        f"{rounds} alternating rounds per side after a {warmup}-document warm-up; best round reported. "
        f"`tulip-rose embed` runs as a subprocess with its defaults (wall time from start to exit, so "
        f"Python start-up, reading, the resumable batch files and writing the `.npy` are included); "
        f"sentence-transformers `encode` (batch {st_batch}, its default) in-process. Torch threads = "
        f"{stack.threads}, fp32.\n",
        table(["side", "docs/s per round", "best docs/s", "best tokens/s"],
              [[k, ", ".join(f"{x:.1f}" for x in v), best[k], round(best[k] * tokens / docs, 1)]
               for k, v in rates.items()]),
        f"\nRatio (best / best): **{speedup}×** (target ≥ 1.0×: {'met' if data['target_met'] else 'missed'}).",
        f"Rows in input order: {in_order}; largest cosine deviation from sentence-transformers, row by row: "
        f"{deviation:.2e}.",
        "\nThe command's last progress line (rates counted by the command itself): "
        + "; ".join(f"`{x}`" for x in progress_lines),
    ])
    return data, md


def plot(data: dict, path: Path) -> Path:
    return plots.throughput_bars({f"{data['params']['docs']:,} documents": data["best_docs_per_s"]},
                                 path, "Bulk embedding: documents / s (best round)")


def options(scale: float) -> dict:
    return {"docs": scaled(20000, scale, 100), "rounds": scaled(2, scale, 1)}
