"""``python -m bench <command>``: one command per benchmark; ``cpu`` runs
the whole CPU suite (what ``make bench`` runs)."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from bench.harness.external import SCRIPTS
from bench.harness.results import Writer, default_dir, now

# command → module in bench/suites/ (each has TITLE and run(stack, **options)).
COMMANDS = {
    "online": "online",
    "scoring": "scoring",
    "throughput": "throughput",
    "batch": "batch",
    "concurrency": "concurrency",
    "queries": "queries",
    "overhead": "overhead",
    "routing": "routing",
    "overlap": "overlap",
    "isolation": "isolation",
    "bulk": "bulk",
    "tracing": "tracing",
    "ray": "ray",
    "cpu-steps": "cpu_steps",
    "late-chunking": "late_chunking",
    "lora": "lora",
    "batch-api": "batch_api",
    "batch-chaos": "batch_chaos",
    "cpu-warm-start": "cpu_warm_start",
    "sim-images": "sim_images",
    "image-embed": "image_embed",
    "image-prep": "image_prep",
    "cpu-threads": "cpu_threads",
    "query-path": "query_path",
    "cpu-pin": "cpu_pin",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=[*COMMANDS, "tokenizer", *SCRIPTS, "cpu", "reliability", "sim", "autoscale"])
    p.add_argument("--out", type=Path, default=None, help="results folder (default bench/results/<date>-<machine>)")
    p.add_argument("--model", default=None, help="model directory (default: the embedded all-MiniLM-L6-v2)")
    p.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)),
                   help="torch threads for every side (Tulip, in-process baselines, Infinity)")
    p.add_argument("--scale", type=float, default=1.0,
                   help="multiplies every request count (0.2 for a quick look)")
    p.add_argument("--docs", type=int, default=None,
                   help="bulk: documents in the file (default 20000, times --scale)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", dest="mode", action="store_const", const="quick",
                      help="reliability: the few-minute mode (default); sim, autoscale: a small run (the benchmark dry run); "
                           "ray: 2,000 documents; late-chunking: three documents, no simulated device")
    mode.add_argument("--full", dest="mode", action="store_const", const="full",
                      help="reliability: the full mode (about an hour; the committed figures)")
    p.add_argument("--only", default=None,
                   help="reliability: comma-separated sections (soak, overload, chaos, fuzz_http, fuzz_grpc, "
                        "tokenizer_fuzz); sim: isolation[:roofline|published] (queries under indexing only), "
                        "late-chunking (issue 46's throughput at GPU speed only)")
    return p


def set_environment() -> None:
    """Before torch loads, here and (inherited) in every server started.
    OpenMP workers that spin while waiting are ruinous on a shared,
    oversubscribed machine (bench/README.md, "Same threads"); passive
    waiting applies to every side alike."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    set_environment()
    # Every benchmark writes a PNG at its end: fail now, not after an hour.
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("bench needs its extras: pip install -e '.[bench]' (or make bench)", file=sys.stderr)
        return 2
    out = args.out or default_dir()
    command = [Path(sys.executable).name, "-m", "bench", *(argv if argv is not None else sys.argv[1:])]
    writer = Writer(out, command)
    if args.command == "cpu":
        from bench.suites import cpu

        return cpu.run_suite(writer, args)
    if args.command == "sim":  # the simulated device (docs/simulated-device.md)
        from bench import sim

        return sim.run_suite(writer, args)
    if args.command == "autoscale":  # the Tulip pool's scaling rule over a replayed day
        from bench import autoscale

        return autoscale.run_suite(writer, args)
    if args.command == "reliability":
        from bench import reliability

        path = reliability.run_suite(writer, args.mode or "quick", args.only.split(",") if args.only else None)
        print(path.read_text())
        return 0
    if args.command in SCRIPTS:
        from bench.harness import external

        status = external.run(args.command, writer.out_dir, args.threads)
        print(json.dumps(status, indent=1))
        return 0 if status["status"] in ("ran", "not available") else 1
    if args.command == "tokenizer":
        from bench.suites import tokenizer

        status = tokenizer.run_program(writer.out_dir)
        print(json.dumps(status, indent=1))
        return 0 if status["status"] in ("ran", "not available") else 1

    from bench.harness.stack import Stack

    module = importlib.import_module(f"bench.suites.{COMMANDS[args.command]}")
    started = now()
    # `ray --quick`: a tenth of the documents (the full run takes many minutes);
    # a suite with its own quick mode (quick_options) takes that.
    if args.mode == "quick" and hasattr(module, "quick_options"):
        opts = module.quick_options()
    else:
        opts = module.options(0.1 if args.command == "ray" and args.mode == "quick" else args.scale)
    if args.docs is not None and "docs" in opts:
        opts["docs"] = args.docs
    with Stack(args.model, threads=args.threads) as stack:
        data, md = module.run(stack, **opts)
        path = writer.write(args.command, module.TITLE, data, md, stack.gates, started, stack.extra_versions())
    if hasattr(module, "plot"):  # a benchmark with its own figure
        module.plot(data, writer.out_dir / f"{args.command}.png")
    print(path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
