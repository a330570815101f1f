"""The GPU benchmark, in one call that ends well inside ten minutes.

Sections run in order of value, each isolated (a failure is recorded and
the next one runs), and ``gpu.json`` + ``gpu.md`` are rewritten after every
one, so a crash or a kill keeps what was done:

0. preflight (<= 60 s, stops the run on failure): versions, the Tulip
   extension, the gRPC stubs, an event waited on by Rust from a fresh
   thread, one Tulip start and one request;
1. ``gate/<model>``: ROSE against ``transformers`` on the same seeded random
   weights (cosine >= 0.999), every attention backend, each isolated;
2. ``check/graph_replay/<model>``: CUDA graph replay equals ROSE's own eager
   output in the same dtype;
3. ``check/event_wait``: the LazyTensor's event waited on by Tulip's Rust
   code in another thread, without the GIL;
4. per timed shape (BGE-M3 = XLM-R large; pplx-embed-1-0.6b ≈ Qwen3-0.6B
   bidirectional): ``<model>/graphs`` (eager vs graphs per length, the
   kernel-launch inflection point), ``<model>/calibrate`` (the simulated
   device's cost model fitted to this device), ``<model>/online``,
   ``<model>/scoring``;
5. then ``<model>/throughput``, ``<model>/concurrency``, ``<model>/overlap``;
6. ``backends``: every attention backend timed per (shape, batch) cell, and
   the selection table those cells make;
7. ``gpu_tests``: the repository's ``gpu``-marked tests (never run elsewhere).

    python -m bench.gpu.run                          # on the GPU machine
    python -m bench.gpu.run --dry-run --out /tmp/x   # on a CPU, tiny shapes

Every flag is also an environment variable (in brackets in ``--help``).
Exit status: 0 all passed, 1 a gate/check/section failed, 2 the preflight
failed, 3 a forced crash (``--fail-section NAME=exit``), 124 the watchdog.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from bench.gpu import charts, checks, models, preflight  # noqa: E402
from bench.gpu.loadgen import Loadgen  # noqa: E402
from bench.gpu.recorder import EXIT_FAILED, EXIT_PREFLIGHT, Budget, Recorder, Skip, parse_failures  # noqa: E402
from bench.gpu.report import markdown  # noqa: E402
from bench.gpu.sizes import Sizes, fitting, graph_configurations  # noqa: E402
from bench.gpu.timing import eager_vs_graphs, inflection  # noqa: E402

GATED = ("minilm", "bge-m3", "pplx-0.6b")
TIMED = ("bge-m3", "pplx-0.6b")
DRY_TIMED = ("minilm",)  # keeps every timing section exercised on the BERT path
# A Tulip start on the GPU (torch import, CUDA context, a 0.6B model, its
# graph captures) takes well under a minute; a hung one must not eat the run.
START_TIMEOUT_S = 90.0


def env_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    env = os.environ.get
    p.add_argument("--dry-run", action="store_true", default=env_flag("GPU_DRY_RUN"),
                   help="CPU, tiny shapes, tiny counts [GPU_DRY_RUN]")
    p.add_argument("--out", type=Path, default=Path(env("OUT")) if env("OUT") else None,
                   help="output folder for gpu.json and gpu.md [OUT]")
    p.add_argument("--budget", type=float, default=float(env("GPU_BUDGET", 420)),
                   help="seconds after which no new section starts [GPU_BUDGET]")
    p.add_argument("--hard-limit", type=float, default=float(env("GPU_HARD_LIMIT", 540)),
                   help="seconds after which the watchdog records where it was and exits [GPU_HARD_LIMIT]")
    p.add_argument("--only", default=env("GPU_ONLY", ""),
                   help="comma-separated section patterns to run (fnmatch, e.g. 'gate/*,check/*'); "
                        "the preflight always runs [GPU_ONLY]")
    p.add_argument("--fail-section", default=env("GPU_FAIL_SECTION", ""),
                   help="testing the harness: 'PATTERN[=raise|exit],...' makes matching sections raise, or "
                        "crash the process (exit 3), at their start [GPU_FAIL_SECTION]")
    default_ivy = env("IVY_BIN") or str(REPO / "gpu-bundle" / "ivy")
    p.add_argument("--ivy", type=Path, default=Path(default_ivy),
                   help="the ivy binary; without it the concurrency chart goes to Tulip over gRPC [IVY_BIN]")
    default_loadgen = env("LOADGEN_BIN") or str(REPO / "gpu-bundle" / "loadgen")
    p.add_argument("--loadgen", type=Path, default=Path(default_loadgen),
                   help="the compiled load generator (bench/crates/loadgen); without it the online and concurrency "
                        "charts use Python clients [LOADGEN_BIN]")
    args = p.parse_args(argv)
    if args.out is None:
        p.error("--out is required when $OUT is not set")
    if not args.dry_run and not torch.cuda.is_available():
        p.error("no CUDA device: use --dry-run on a CPU")
    return args


class Run:
    """One run's shared state: device, sizes, the gated models, servers."""

    def __init__(self, args: argparse.Namespace, rec: Recorder, work: Path):
        self.args, self.rec, self.work, self.log_dir = args, rec, work, work / "logs"
        self.dry = args.dry_run
        self.device, self.dtype = ("cpu", "float32") if self.dry else ("cuda", "bfloat16")
        self.sizes = Sizes(self.dry)
        self.captures = graph_configurations(self.sizes) if self.device == "cuda" else {}
        lg = Loadgen(args.loadgen)
        self.loadgen = lg if lg.available() else None
        self.gated: dict[str, dict] = {}
        self.servers: dict[str, object] = {}
        self.procs: list = []
        rec.on_exit(self.stop_all)

    def register(self, proc) -> None:
        self.procs.append(proc)

    def stop_all(self) -> None:
        from tulip_rose_cli import processes

        while self.procs:
            p = self.procs.pop()
            try:
                p.stop(timeout=10)
            except Exception:  # best effort while exiting
                p.kill()
        processes.kill_all()  # any still starting

    # 0. Preflight.

    def preflight(self) -> bool:
        budget, steps = self.rec.budget, [
            ("versions", lambda: preflight.versions(self.device)),
            ("extension", preflight.extension),
            ("stubs", preflight.stubs),
            ("event_wait", lambda: preflight.event_wait(self.device)),
            ("binaries", self._binaries),
            ("tulip", self._preflight_tulip),
        ]
        for name, fn in steps:
            self.rec.section(f"preflight/{name}", fn, budgeted=False, always=True)
            rec = self.rec.result["sections"][f"preflight/{name}"]
            if rec["status"] != "ok":
                why = rec.get("error")
                self.rec.result["preflight"] = {"passed": False, "step": name, "error": why}
                self.rec.write()
                print(f"PREFLIGHT FAILED at {name}: {why}", file=sys.stderr, flush=True)
                return False
        # The limit is enforced by the steps' own timeouts (the server start
        # gets what is left of it); a preflight that ends a little late but
        # works is noted, not fatal.
        self.rec.result["preflight"] = {"passed": True, "seconds": budget.elapsed,
                                        "within_limit": budget.elapsed <= preflight.LIMIT_S}
        self.rec.write()
        return True

    def _binaries(self) -> dict:
        """The carried ivy and loadgen run here (they need glibc >= 2.34 as
        built); one that does not is left out, with a note, and its charts
        fall back to gRPC and Python clients instead of failing."""
        out = {}
        for name in ("ivy", "loadgen"):
            path = getattr(self.args, name)
            out[name] = preflight.binary(path)
            if not out[name].get("runs"):
                setattr(self.args, name, Path("/nonexistent") / name)
                if name == "loadgen":
                    self.loadgen = None
        return out

    def _preflight_tulip(self) -> dict:
        shape = models.tiny(models.SHAPES["minilm"])
        d = self.work / "preflight-model"
        models.build(shape, d, self.device)
        # What is left of the minute, but never so little that a healthy
        # first CUDA start (torch import, context, model load) cannot make it.
        left = max(30.0, preflight.LIMIT_S - self.rec.budget.elapsed)
        return preflight.tulip_request(d, self.device, self.dtype, self.log_dir, left, self.register)

    # 1-3. Gate and checks.

    def gate(self, name: str) -> None:
        def run():
            shape = models.tiny(models.SHAPES[name]) if self.dry else models.SHAPES[name]
            d = self.work / name
            hf = models.build(shape, d, self.device)
            seqs = [models.token_ids(shape, n, seed=n) for n in (1, 5, 17, 64, 130, min(300, shape.max_length))]
            want = models.reference(hf, shape, seqs)
            from rose import ModelLoadError

            try:
                checks.engine(d, self.device, self.dtype)
            except ModelLoadError as e:
                raise Skip(f"ROSE does not load this architecture: {e}") from e
            floor = checks.dtype_floor(hf, shape, seqs, want, self.dtype)
            records = checks.gate(shape, d, want, seqs, self.device, self.dtype, floor)
            if checks.gate_passed(records):
                self.gated[name] = {"shape": shape, "dir": d, "hf": hf, "seqs": seqs, "want": want}
            return records

        self.rec.section(f"gate/{name}", run, verdict=checks.gate_passed)

    def graph_replay(self, name: str) -> None:
        m = self.gated[name]
        self.rec.section(f"check/graph_replay/{name}",
                         lambda: checks.graph_replay(m["dir"], m["seqs"], self.device, self.dtype),
                         verdict=lambda r: r["status"] == "passed")

    def event_wait(self, name: str) -> None:
        m = self.gated[name]

        def run():
            e = checks.engine(m["dir"], self.device, self.dtype)
            return checks.wait_event(e, m["seqs"], m["want"].numpy(), self.device)

        self.rec.section("check/event_wait", run, verdict=lambda r: r["status"] == "passed")

    # 4-5. Timed sections.

    def hf(self, m: dict):
        if "hf_typed" not in m:
            m["hf_typed"] = copy.deepcopy(m["hf"]).to(getattr(torch, self.dtype))
        return m["hf_typed"]

    def lengths(self, m: dict) -> list[int]:
        return [n for n in self.sizes.lengths if n <= m["shape"].max_length]

    def server(self, name: str, key: str = "serving", **flags):
        """The model's Tulip for ``key``, started on first use."""
        from tulip_rose_cli.launch import Tulip

        if (name, key) not in self.servers:
            m = self.gated[name]
            configs = fitting(self.captures.get(key, []), m["shape"].max_length)

            def start(**extra):
                t = Tulip(str(m["dir"]), log_dir=self.log_dir, device=self.device, dtype=self.dtype,
                          timeout=START_TIMEOUT_S, **flags, **extra)
                self.register(t)
                return t

            try:
                t = start(capture=",".join(configs)) if configs else start()
            except RuntimeError as e:  # a capture it cannot do must not cost every chart
                if not configs:
                    raise
                print(f"    {name}: start with --capture failed, starting without: {str(e)[:300]}",
                      file=sys.stderr, flush=True)
                self.rec.result.setdefault("capture_failed", {})[f"{name}/{key}"] = str(e)[-2000:]
                t = start()
            self.servers[(name, key)] = t
        return self.servers[(name, key)]

    def graphs(self, name: str) -> None:
        m = self.gated[name]

        def run():
            shape, d = m["shape"], m["dir"]
            eager = checks.engine(d, self.device, self.dtype)
            graphed = checks.engine(d, self.device, self.dtype, graphs=True)
            by_length = eager_vs_graphs(eager, graphed, self.hf(m), shape, self.lengths(m), self.sizes.rounds,
                                        self.device)
            sweep = eager_vs_graphs(eager, graphed, None, shape, self.sizes.sweep, self.sizes.sweep_rounds,
                                    self.device)
            return {"eager_vs_graphs": by_length, "sweep": sweep, "inflection_tokens": inflection(sweep)}

        self.rec.section(f"{name}/graphs", run)

    def calibrate(self, name: str) -> None:
        """The simulated device's ``t0, a, b`` fitted to this device's steps
        (CUDA graphs, launch to rows on the host, over a grid of sequences x
        length); written to ``sim-cost-<model>.json`` for ``--sim-cost``."""
        m, s = self.gated[name], self.sizes

        def run():
            from bench.gpu import calibrate

            e = checks.engine(m["dir"], self.device, self.dtype, graphs=True)
            cells = calibrate.grid(s.calib_lengths, s.calib_counts, s.calib_max_tokens)
            result = calibrate.calibrate(calibrate.measure(e, cells, s.calib_rounds))
            calibrate.write_cost(result, self.args.out / f"sim-cost-{name}.json")
            return result

        self.rec.section(f"{name}/calibrate", run)

    def online(self, name: str) -> None:
        m = self.gated[name]
        self.rec.section(f"{name}/online", lambda: charts.online(
            self.server(name), self.hf(m), m["shape"], self.lengths(m), self.sizes.rounds, self.device,
            self.loadgen))

    def scoring(self, name: str) -> None:
        m, s = self.gated[name], self.sizes
        self.rec.section(f"{name}/scoring", lambda: charts.scoring(
            self.server(name), self.hf(m), m["shape"], min(s.score_length, m["shape"].max_length),
            s.score_batches, s.score_rounds, self.device))

    def throughput(self, name: str) -> None:
        m, s = self.gated[name], self.sizes
        self.rec.section(f"{name}/throughput", lambda: charts.throughput(
            self.server(name), self.hf(m), m["shape"], s.tput_lengths.get(name, s.tput_default),
            s.tput_clients, s.tput_batch, s.tput_requests, self.device))

    def concurrency(self, name: str) -> None:
        m, s = self.gated[name], self.sizes

        def run():
            from bench.harness import inputs
            from tulip_rose_cli.launch import Ivy

            tulip = self.server(name)
            port, texts, how = None, None, "gRPC, pre-tokenized (no Ivy binary)"
            if self.args.ivy.is_file():
                ivy = Ivy([tulip.url], str(m["dir"]), log_dir=self.log_dir, binary=self.args.ivy)
                self.register(ivy)
                port, how = ivy.port, "HTTP through Ivy, real text"
                texts = inputs.texts_of_tokens(str(m["dir"]), s.conc_length, 8)
            out = charts.concurrency(port, tulip, m["shape"], texts, s.conc_length, s.conc_levels, s.conc_per_level,
                                     self.loadgen)
            return {"path": how, "client": "loadgen" if self.loadgen else "python", "by_clients": out}

        self.rec.section(f"{name}/concurrency", run)

    def overlap(self, name: str) -> None:
        def run():
            # Two steps in flight (the default) against one.
            on = self.server(name)
            off = self.server(name, "overlap-off", max_inflight=1)
            return charts.overlap({"on": on, "off": off}, self.gated[name]["shape"], **self.sizes.overlap)

        self.rec.section(f"{name}/overlap", run)

    def backends(self) -> None:
        def run():
            from bench.scripts import attention_sweep as sweep

            shapes = [s for s in sweep.GPU_SHAPES if s[0] in ("bge-m3", "pplx-0.6b", "qwen3-0.6b")]
            if self.dry:
                shapes = [s for s in sweep.CPU_SHAPES if s[0] == "minilm"]
            dt = getattr(torch, self.dtype)
            cells = sweep.sweep(torch.device(self.device), dt, shapes, sweep.GRIDS[self.sizes.sweep_grid],
                                self.sizes.sweep_iters)
            return {"cells": cells}

        self.rec.section("backends", run)

    def gpu_tests(self) -> None:
        """The repository's ``gpu``-marked pytest tests, which only ever run
        on a GPU machine; bounded by what is left of the hard limit."""
        def run():
            import subprocess

            left = max(30.0, self.args.hard_limit - self.rec.budget.elapsed - 30)
            res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
                                  "tests/rose", "tests/tulip/test_overlap.py"], cwd=REPO, capture_output=True, text=True,
                                 timeout=left)
            tail = (res.stdout + res.stderr)[-3000:]
            return {"exit_status": res.returncode, "summary": tail.strip().splitlines()[-1:], "output_tail": tail}

        self.rec.section("gpu_tests", run, verdict=lambda r: r["exit_status"] in (0, 5))

    def skip(self, section: str, name: str) -> None:
        self.rec.skip(f"{name}/{section}", "not gated (failed or errored gate, or not run)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    budget = Budget(args.budget)
    result: dict = {"command": [sys.executable, "-m", "bench.gpu.run", *(argv if argv is not None else sys.argv[1:])],
                    "dry_run": args.dry_run, "budget_s": args.budget}
    only = [p.strip() for p in args.only.split(",") if p.strip()]
    rec = Recorder(args.out, result, budget, markdown, only, parse_failures(args.fail_section))
    rec.watchdog(args.hard_limit)
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        run = Run(args, rec, Path(tmp))
        result["work_dir"] = tmp
        try:
            if not run.preflight():
                return EXIT_PREFLIGHT
            for name in GATED:
                run.gate(name)
            for name in GATED:
                if name in run.gated:
                    run.graph_replay(name)
            first = next(iter(run.gated), None)
            if first is not None:
                run.event_wait(first)
            timed = DRY_TIMED if args.dry_run else TIMED
            phases = [("graphs", run.graphs), ("calibrate", run.calibrate), ("online", run.online),
                      ("scoring", run.scoring)], \
                [("throughput", run.throughput), ("concurrency", run.concurrency), ("overlap", run.overlap)]
            for phase in phases:
                for name in timed:
                    for section, fn in phase:
                        if name in run.gated:
                            fn(name)
                        else:
                            run.skip(section, name)
            run.backends()
            run.gpu_tests()
        finally:
            run.stop_all()
    failed = rec.failed()
    result["passed"] = not failed
    rec.write()
    print(f"[{budget.elapsed:6.1f}s] wrote {args.out / 'gpu.json'} and gpu.md; "
          f"{'all passed' if not failed else 'FAILED: ' + ', '.join(failed)}", flush=True)
    return 0 if not failed else EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
