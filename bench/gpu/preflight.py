"""The preflight: at most a minute before anything is timed, it checks what
the rest of the run needs, in the order it would break: versions, the Tulip
extension, the gRPC stubs, a LazyTensor-style event waited on by Rust from a
fresh thread, one Tulip start and one request. The first failure stops the
run with a message that says what to fix."""

from __future__ import annotations

import importlib
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

LIMIT_S = 60.0


class PreflightError(RuntimeError):
    """A preflight step failed; the message says what to fix."""


def _version(module: str) -> str | None:
    try:
        return importlib.import_module(module).__version__
    except Exception:  # absent or broken: reported as None
        return None


def versions(device: str) -> dict:
    env = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda": torch.version.cuda,
           "transformers": _version("transformers"), "grpcio": _version("grpc"),
           "protobuf": _version("google.protobuf"), "numpy": _version("numpy"),
           "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    if device == "cuda":
        try:
            smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,memory.used",
                                  "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
            env["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
        except (OSError, subprocess.SubprocessError) as e:
            env["nvidia_smi"] = f"unavailable: {e}"
    return env


def extension() -> dict:
    try:
        import tulip._native as native
    except ImportError as e:
        raise PreflightError(f"the Tulip extension does not import ({e}): carry tulip/_native.abi3.so "
                             "(make gpu-bundle builds it)") from e
    missing = [f for f in ("serve", "wait_event", "bind_cuda_device") if not hasattr(native, f)]
    if missing:
        raise PreflightError(f"{native.__file__} is an old build without {', '.join(missing)}: rebuild it")
    return {"path": native.__file__, "version": native.__version__}


def stubs() -> dict:
    from tulip.client import load_stubs

    pb2, grpc_mod = load_stubs("tulip")
    pb2.EmbedRequest(token_ids=[1, 2], lengths=[2]).SerializeToString()
    return {"source": "descriptor set" if not hasattr(pb2, "__file__") else pb2.__file__,
            "stub": grpc_mod.TulipStub.__name__}


def binary(path: Path) -> dict:
    """Whether a carried binary starts here (``--version``)."""
    if not Path(path).is_file():
        return {"path": str(path), "runs": False, "note": "absent"}
    try:
        res = subprocess.run([str(path), "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError) as e:
        return {"path": str(path), "runs": False, "note": f"{type(e).__name__}: {e}"}
    ok = res.returncode == 0
    return {"path": str(path), "runs": ok, "note": (res.stdout if ok else res.stderr).strip()[-500:]}


def event_wait(device: str, timeout: float = 20.0) -> dict:
    """An event recorded behind real GPU work, waited on by
    ``tulip._native.wait_event`` in a thread that never touched CUDA (as
    Tulip's completion thread); on the CPU the no-event path from a thread."""
    from tulip._native import wait_event

    handle, event = 0, None
    if device == "cuda":
        a = torch.randn(2048, 2048, device="cuda")
        for _ in range(8):
            a = a @ a
            a /= a.norm()
        event = torch.cuda.Event(blocking=True)
        event.record()
        handle = event.cuda_event
    errors: list[BaseException] = []

    def waiter():
        try:
            wait_event(handle, timeout_s=timeout)
        except BaseException as e:  # reported below
            errors.append(e)

    t = threading.Thread(target=waiter, name="preflight-wait")
    start = time.perf_counter()
    t.start()
    t.join(timeout + 5)
    if t.is_alive():
        raise PreflightError(f"wait_event did not return within {timeout + 5:.0f}s")
    if errors:
        raise PreflightError(f"wait_event from a fresh thread failed: {errors[0]!r}")
    if event is not None and not event.query():
        raise PreflightError("wait_event returned before the event completed")
    return {"handle_nonzero": handle != 0, "waited_ms": round((time.perf_counter() - start) * 1e3, 2)}


def tulip_request(model_dir: Path, device: str, dtype: str, log_dir: Path, timeout: float,
                  register) -> dict:
    """One Tulip on ``model_dir`` and one Embed; ``register`` gets the
    server so a watchdog can kill it."""
    import numpy as np

    from tulip_rose_cli.launch import Tulip

    start = time.perf_counter()
    tulip = Tulip(str(model_dir), log_dir=log_dir, device=device, dtype=dtype, timeout=timeout)
    register(tulip)
    try:
        started = time.perf_counter() - start
        with tulip.client() as c:
            c.timeout = 30
            out = c.embed([[101, 2000, 2001, 102]])
        values = np.asarray(out.values)
        if values.shape[0] != 1 or not np.isfinite(values).all():
            raise PreflightError(f"Tulip answered {values.shape} with non-finite values")
        return {"start_s": round(started, 2), "request_ms": round((time.perf_counter() - start - started) * 1e3, 2),
                "dim": int(values.shape[1])}
    except Exception as e:
        raise PreflightError(f"Tulip started but the request failed: {e}\n{tulip.log()[-2000:]}") from e
    finally:
        tulip.stop(timeout=10)
