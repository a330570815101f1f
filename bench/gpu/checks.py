"""Before any timing on the GPU: ROSE against ``transformers`` on the same
random weights for every architecture and attention backend (the gate), then
the micro-checks: the LazyTensor's event waited on by Tulip's Rust code from
another thread without the GIL, and CUDA graph replay equal to eager."""

from __future__ import annotations

import ctypes
import inspect
import threading
import time

import numpy as np
import torch

from bench.gate import THRESHOLD, cosines
from bench.gpu.models import Shape

REPLAY_THRESHOLD = 0.9999


def backends(device: str) -> list[str]:
    """Attention backends ROSE has on this machine."""
    from rose.attention.registry import available_backends

    takes_device = bool(inspect.signature(available_backends).parameters)
    return sorted(available_backends(device) if takes_device else available_backends())


def engine(model_dir, device: str, dtype: str, attention: str = "auto", graphs: bool = False):
    from rose import Engine

    return Engine.from_dir(model_dir, device=device, dtype=dtype, attention=attention, graphs=graphs,
                           static_on_cpu=graphs and device == "cpu")


def gate(shape: Shape, model_dir, want: torch.Tensor, sequences: list[list[int]], device: str,
         dtype: str) -> list[dict]:
    """One record per attention backend: min cosine of ROSE's output against
    ``want`` (the transformers reference). A backend that does not support
    the shape is recorded as skipped."""
    records = []
    for name in backends(device):
        rec = {"model": shape.name, "backend": name, "dtype": dtype, "rows": len(sequences)}
        try:
            e = engine(model_dir, device, dtype, attention=name)
        except ValueError as err:  # the backend does not take this shape/device/dtype
            records.append({**rec, "status": "skipped", "reason": str(err)})
            continue
        got = e.embed(sequences).float().numpy()
        cos = float(cosines(got, want.numpy()).min())
        records.append({**rec, "status": "passed" if cos >= THRESHOLD else "FAILED", "min_cosine": round(cos, 6)})
        del e
    return records


def wait_event(e, sequences: list[list[int]], want: np.ndarray, device: str) -> dict:
    """Launches a step behind a GPU sleep, waits for its event in a Python
    thread through ``tulip._native.wait_event`` (which releases the GIL),
    counts what the main thread got done meanwhile, then reads the rows
    straight from the pinned host pointer."""
    from rose import Batch
    from tulip._native import wait_event as rust_wait

    if device == "cuda" and hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(200_000_000)  # ≈0.1 s of GPU time queued before the step
    lazy = e.step(Batch.from_lists(sequences))
    handle, ptr, rows, cols = lazy.event_handle, lazy.host_ptr(), lazy.rows, lazy.cols
    done = threading.Event()
    error: list[BaseException] = []

    def waiter():
        try:
            rust_wait(handle)
        except BaseException as err:  # reported below
            error.append(err)
        finally:
            done.set()

    start = time.perf_counter()
    t = threading.Thread(target=waiter)
    t.start()
    spins = 0
    while not done.is_set():
        spins += 1  # the main thread runs Python while the waiter waits
    t.join()
    waited = time.perf_counter() - start
    got = np.ctypeslib.as_array((ctypes.c_float * (rows * cols)).from_address(ptr)).reshape(rows, cols).copy()
    lazy.release()
    cos = float(cosines(got, want).min())
    ok = not error and cos >= REPLAY_THRESHOLD
    return {"check": "Rust event wait from another thread without the GIL", "event_handle_nonzero": handle != 0,
            "waited_ms": round(waited * 1e3, 3), "main_thread_iterations_meanwhile": spins,
            "min_cosine_vs_eager": round(cos, 6), "error": repr(error[0]) if error else None,
            "status": "passed" if ok else "FAILED"}


def graph_replay(model_dir, sequences: list[list[int]], want: np.ndarray, device: str, dtype: str) -> dict:
    """The same batch three times through a graphs engine (warm-up, capture,
    replay) against the eager output."""
    e = engine(model_dir, device, dtype, graphs=True)
    outs, modes = [], []
    from rose import Batch

    for _ in range(3):
        lazy = e.step(Batch.from_lists(sequences))
        outs.append(lazy.tensor().clone().numpy())
        modes.append(lazy.mode)
        lazy.release()
    cos = float(min(cosines(o, want).min() for o in outs))
    return {"check": "graph capture/replay equals eager", "modes": modes, "min_cosine_vs_eager": round(cos, 6),
            "status": "passed" if cos >= REPLAY_THRESHOLD else "FAILED"}
