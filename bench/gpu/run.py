"""The GPU benchmark, in one call that stays well inside ~8 minutes:

1. nvidia-smi, torch and CUDA versions;
2. the correctness gate: ROSE against ``transformers`` on the same seeded
   random weights (cosine >= 0.999), every architecture, every attention
   backend; a model that fails is never timed;
3. micro-checks: the LazyTensor's event waited on from another thread by
   Tulip's Rust code without the GIL; CUDA graph replay equals eager;
4. per benchmark shape (BGE-M3 = XLM-R large; pplx-embed-1-0.6b ≈ Qwen3-0.6B
   bidirectional + mean + tanh int8): eager vs CUDA graphs at 128/512/4096
   tokens batch 1 with ``transformers`` eager as the in-run baseline, the
   kernel-launch inflection point, the four published charts at reduced
   request counts through a real Tulip (and Ivy), overlap on vs off;
5. ``gpu.json`` and ``gpu.md`` in ``--out`` (default ``$OUT``).

    python -m bench.gpu.run                          # on the GPU machine
    python -m bench.gpu.run --dry-run --out /tmp/x   # on a CPU, tiny shapes

Exit status 1 when a gate or a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from bench.gpu import charts, checks, models  # noqa: E402
from bench.gpu.report import markdown  # noqa: E402
from bench.gpu.timing import eager_vs_graphs, inflection  # noqa: E402

TIMED = ("bge-m3", "pplx-0.6b")
GATED = ("minilm", *TIMED)


class Sizes:
    """Request counts and lengths: the real ones, or tiny for the dry run."""

    def __init__(self, dry: bool):
        self.lengths = [16, 64, 128] if dry else [128, 512, 4096]
        self.sweep = [8, 32, 128] if dry else [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
        self.rounds = 5 if dry else 50
        self.sweep_rounds = 3 if dry else 20
        self.score_length = 64 if dry else 512
        self.score_batches = [5, 25, 50]
        self.score_rounds = 2 if dry else 15
        # BENCHMARKS.md's batch chart: three lengths for BGE-M3, 512 for the rest.
        self.tput_lengths = {"bge-m3": [32] if dry else [512, 1024, 4096]}
        self.tput_default = [32] if dry else [512]
        self.tput_batch, self.tput_clients, self.tput_requests = (20, 2, 1) if dry else (100, 4, 2)
        self.conc_levels = [1, 2] if dry else [1, 2, 4, 8, 16]
        self.conc_length = 64 if dry else 512
        self.conc_per_level = 6 if dry else 64
        self.overlap = dict(length=16 if dry else 128, clients=2 if dry else 8, requests=4 if dry else 40,
                            rounds=1 if dry else 3)


def environment(device: str) -> dict:
    env = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": sys.version.split()[0],
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    try:
        import transformers

        env["transformers"] = transformers.__version__
    except ImportError:
        env["transformers"] = None
    try:
        smi = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30)
        env["nvidia_smi"] = smi.stdout
    except (OSError, subprocess.SubprocessError) as e:
        env["nvidia_smi"] = f"unavailable: {e}"
    print(env.pop("nvidia_smi"), flush=True) if device == "cuda" else env.pop("nvidia_smi")
    print(json.dumps(env), flush=True)
    return env


class Budget:
    def __init__(self, seconds: float):
        self.t0, self.seconds = time.monotonic(), seconds

    @property
    def elapsed(self) -> float:
        return round(time.monotonic() - self.t0, 1)

    def left(self) -> bool:
        return self.elapsed < self.seconds


def section(result: dict, key: str, budget: Budget, fn):
    """Runs one timed section unless the budget is spent; a failure is
    recorded and the run goes on."""
    if not budget.left():
        result[key] = {"skipped": f"time budget spent ({budget.elapsed}s)"}
        return None
    print(f"[{budget.elapsed:6.1f}s] {key}", flush=True)
    try:
        result[key] = fn()
    except Exception as e:  # one broken section must not lose the rest
        result[key] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-2000:]}
    return result[key]


def gate_model(name: str, dry: bool, device: str, dtype: str, work: Path) -> dict:
    shape = models.tiny(models.SHAPES[name]) if dry else models.SHAPES[name]
    d = work / name
    hf = models.build(shape, d, device)
    seqs = [models.token_ids(shape, n, seed=n) for n in (1, 5, 17, 64, 130, min(300, shape.max_length))]
    want = models.reference(hf, shape, seqs)
    from rose import ModelLoadError

    try:
        checks.engine(d, device, dtype)
    except ModelLoadError as e:
        return {"shape": shape, "dir": d, "hf": hf, "supported": False, "reason": str(e), "gate": []}
    records = checks.gate(shape, d, want, seqs, device, dtype)
    passed = any(r["status"] == "passed" for r in records) and not any(r["status"] == "FAILED" for r in records)
    return {"shape": shape, "dir": d, "hf": hf, "supported": True, "gate": records, "passed": passed,
            "seqs": seqs, "want": want}


def micro_checks(m: dict, device: str, dtype: str) -> list[dict]:
    e = checks.engine(m["dir"], device, dtype)
    want = m["want"].numpy()
    out = [checks.wait_event(e, m["seqs"], want, device), checks.graph_replay(m["dir"], m["seqs"], want, device, dtype)]
    del e
    return out


def time_model(m: dict, sizes: Sizes, device: str, dtype: str, budget: Budget, ivy_bin: Path | None,
               log_dir: Path) -> dict:
    import copy

    from tests import servers
    from tests.servers import Ivy, Tulip

    shape, d = m["shape"], m["dir"]
    hf = copy.deepcopy(m["hf"]).to(getattr(torch, dtype))
    lengths = [n for n in sizes.lengths if n <= shape.max_length]
    res: dict = {"shape": shape.__dict__, "dtype": dtype}

    def engines():
        eager, graphs = checks.engine(d, device, dtype), checks.engine(d, device, dtype, graphs=True)
        res["eager_vs_graphs"] = eager_vs_graphs(eager, graphs, hf, shape, lengths, sizes.rounds, device)
        sweep = eager_vs_graphs(eager, graphs, None, shape, sizes.sweep, sizes.sweep_rounds, device)
        return {"sweep": sweep, "inflection_tokens": inflection(sweep)}

    section(res, "graphs_sweep", budget, engines)
    procs = []
    try:
        def start_tulip():
            t = Tulip(str(d), log_dir=log_dir, device=device, dtype=dtype, timeout=600)
            procs.append(t)
            return {"started": True}

        if section(res, "tulip", budget, start_tulip) and "error" not in res["tulip"]:
            tulip = procs[0]
            section(res, "online", budget, lambda: charts.online(tulip, hf, shape, lengths, sizes.rounds, device))
            section(res, "scoring", budget, lambda: charts.scoring(
                tulip, hf, shape, min(sizes.score_length, shape.max_length), sizes.score_batches,
                sizes.score_rounds, device))
            section(res, "throughput", budget, lambda: charts.throughput(
                tulip, hf, shape, sizes.tput_lengths.get(shape.name, sizes.tput_default),
                sizes.tput_clients, sizes.tput_batch, sizes.tput_requests, device))

            def conc():
                port, texts, how = None, None, "gRPC, pre-tokenized (no Ivy binary)"
                if ivy_bin is not None and ivy_bin.is_file():
                    from bench import inputs

                    servers.IVY_BIN = ivy_bin
                    ivy = Ivy([tulip.url], str(d), log_dir=log_dir)
                    procs.append(ivy)
                    port, how = ivy.port, "HTTP through Ivy, real text"
                    texts = inputs.texts_of_tokens(str(d), sizes.conc_length, 8)
                out = charts.concurrency(port, tulip, shape, texts, sizes.conc_length, sizes.conc_levels,
                                         sizes.conc_per_level)
                return {"path": how, "by_clients": out}

            section(res, "concurrency", budget, conc)

            def overlap():
                # The serving Tulip runs 2 steps in flight (the default); a
                # second one runs 1.
                off = Tulip(str(d), log_dir=log_dir, device=device, dtype=dtype, max_inflight=1, timeout=600)
                procs.append(off)
                return charts.overlap({"on": tulip, "off": off}, shape, **sizes.overlap)

            section(res, "overlap", budget, overlap)
    finally:
        for p in procs:
            p.stop()
    return res


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, tiny counts")
    p.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else None)
    p.add_argument("--budget", type=float, default=420.0, help="seconds after which timed sections are skipped")
    p.add_argument("--ivy", type=Path, default=REPO / "target" / "release" / "ivy", help="the ivy binary")
    args = p.parse_args(argv)
    if args.out is None:
        p.error("--out is required when $OUT is not set")
    args.out.mkdir(parents=True, exist_ok=True)
    if not args.dry_run and not torch.cuda.is_available():
        p.error("no CUDA device: use --dry-run on a CPU")
    device, dtype = ("cpu", "float32") if args.dry_run else ("cuda", "bfloat16")
    budget = Budget(args.budget)
    result: dict = {"command": [sys.executable, "-m", "bench.gpu.run", *(argv or sys.argv[1:])],
                    "dry_run": args.dry_run, "environment": environment(device), "gate": [], "checks": [],
                    "models": {}}
    sizes = Sizes(args.dry_run)
    ok = True
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        work, log_dir = Path(tmp), Path(tmp) / "logs"
        gated = {}
        for name in GATED:
            print(f"[{budget.elapsed:6.1f}s] gate {name}", flush=True)
            m = gate_model(name, args.dry_run, device, dtype, work)
            if not m["supported"]:
                result["gate"].append({"model": name, "status": "skipped", "reason": m["reason"]})
                continue
            result["gate"] += m["gate"]
            ok &= m["passed"]
            if m["passed"]:
                gated[name] = m
        first = next(iter(gated.values()), None)
        if first is not None:
            print(f"[{budget.elapsed:6.1f}s] micro-checks on {first['shape'].name}", flush=True)
            result["checks"] = micro_checks(first, device, dtype)
            ok &= all(c["status"] == "passed" for c in result["checks"])
        timed = [n for n in TIMED if n in gated]
        if args.dry_run and not timed and "minilm" in gated:
            timed = ["minilm"]  # keeps every timing section exercised on the BERT path
        for name in TIMED if not args.dry_run else timed:
            if name in timed:
                result["models"][name] = time_model(gated[name], sizes, device, dtype, budget,
                                                    args.ivy if args.ivy.is_file() else None, log_dir)
            else:
                result["models"][name] = {"not_timed": "not gated (unsupported by ROSE here, or failed the gate)"}
    result["seconds"] = budget.elapsed
    (args.out / "gpu.json").write_text(json.dumps(result, indent=1, default=str) + "\n")
    (args.out / "gpu.md").write_text(markdown(result))
    print(f"[{budget.elapsed:6.1f}s] wrote {args.out / 'gpu.json'} and gpu.md; gates and checks "
          f"{'passed' if ok else 'FAILED'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
