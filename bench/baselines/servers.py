"""Baseline servers as real processes on free ports: Infinity serving the
same model directory, and the minimal FastAPI server."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from bench.harness.httpclient import HttpClient
from bench.harness.results import REPO
from tulip_rose_cli.processes import Process, free_port

INFINITY_VENV = Path(os.environ.get("INFINITY_VENV", REPO / ".venv-infinity"))
INFINITY_MODEL_NAME = "bench"


class Unavailable(RuntimeError):
    """A baseline cannot run on this machine (the message says why)."""


class _HttpServer(Process):
    def __init__(self, name: str, cmd: list[str], env: dict, log_dir: Path, port: int, timeout: float):
        self.port = port
        super().__init__(name, cmd, env, log_dir)
        self.wait_until(self._healthy, timeout, "serving")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> HttpClient:
        return HttpClient("127.0.0.1", self.port)

    def _healthy(self) -> bool:
        try:
            with HttpClient("127.0.0.1", self.port, timeout=2.0) as c:
                status, _ = c.send(f"GET /health HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n\r\n".encode())
            return status == 200
        except OSError:
            return False


def infinity_version() -> str | None:
    dist = list((INFINITY_VENV / "lib").glob("python3*/site-packages/infinity_emb-*.dist-info"))
    return dist[0].name.split("-")[1] if dist else None


class Infinity(_HttpServer):
    """``infinity_emb v2`` (torch engine, CPU or CUDA) on ``model_dir``, from
    its own virtualenv (its pins conflict with ours: ``make .venv-infinity``)."""

    PATH = "/embeddings"

    def __init__(self, model_dir: str, *, log_dir: Path, threads: int = 0, device: str = "cpu",
                 batch_size: int = 32, timeout: float = 300.0):
        exe = INFINITY_VENV / "bin" / "infinity_emb"
        if not exe.is_file():
            raise Unavailable(f"{exe} is missing: run `make .venv-infinity` (installs infinity-emb[server,torch])")
        port = free_port()
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "DO_NOT_TRACK": "1",
               "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
        if threads:
            env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
        # Our own warm-up runs before timing; Infinity's start-up warm-up
        # (batches of 32 at full length) would only slow the start.
        cmd = [str(exe), "v2", "--model-id", model_dir, "--served-model-name", INFINITY_MODEL_NAME,
               "--engine", "torch", "--device", device, "--batch-size", str(batch_size),
               "--no-model-warmup", "--no-bettertransformer", "--host", "127.0.0.1", "--port", str(port),
               "--log-level", "warning"]
        super().__init__(f"infinity-{port}", cmd, env, log_dir, port, timeout)


class FastApiBaseline(_HttpServer):
    """``bench/baselines/fastapi_server.py``: parse → tokenize → no-op → respond."""

    PATH = "/v1/embeddings"

    def __init__(self, tokenizer_dir: str, *, log_dir: Path, dim: int, max_length: int, workers: int = 1,
                 timeout: float = 60.0):
        try:
            import fastapi  # noqa: F401
            import uvicorn  # noqa: F401
        except ImportError as e:
            raise Unavailable(f"{e.name} is not installed: pip install -e '.[bench]'") from None
        port = free_port()
        cmd = [sys.executable, "-m", "bench.baselines.fastapi_server", "--tokenizer", tokenizer_dir,
               "--port", str(port), "--dim", str(dim), "--max-length", str(max_length), "--workers", str(workers)]
        env = {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        super().__init__(f"fastapi-{port}", cmd, env, log_dir, port, timeout)
