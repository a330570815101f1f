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

from bench.gpu.models import Shape
from bench.harness.gate import THRESHOLD, cosines

REPLAY_THRESHOLD = 0.9999
FLOOR_LIMIT = 0.99
WAIT_LIMIT_S = 30.0


def backends(device: str) -> list[str]:
    """Attention backends ROSE has on this machine."""
    from rose.attention.registry import available_backends

    takes_device = bool(inspect.signature(available_backends).parameters)
    return sorted(available_backends(device) if takes_device else available_backends())


def engine(model_dir, device: str, dtype: str, attention: str = "auto", graphs: bool = False):
    from rose import Engine

    return Engine.from_dir(model_dir, device=device, dtype=dtype, attention=attention, graphs=graphs,
                           static_on_cpu=graphs and device == "cpu")


def dtype_floor(hf, shape: Shape, sequences: list[list[int]], want: torch.Tensor, dtype: str) -> float | None:
    """The min cosine of ``transformers`` itself in ``dtype`` against its
    float32 output: how close the dtype lets any implementation get (None
    for float32)."""
    if dtype == "float32":
        return None
    import copy

    from bench.gpu.models import reference

    typed = copy.deepcopy(hf).to(getattr(torch, dtype))
    got = reference(typed, shape, sequences)
    del typed
    return float(cosines(got.numpy(), want.numpy()).min())


def gate(shape: Shape, model_dir, want: torch.Tensor, sequences: list[list[int]], device: str,
         dtype: str, floor: float | None = None) -> list[dict]:
    """One record per attention backend: min cosine of ROSE's output against
    ``want`` (the float32 transformers reference). It passes at >= 0.999,
    or, in a half dtype, at least as close as ``transformers`` in that same
    dtype gets (``floor``): no implementation can beat the dtype's rounding.
    A backend that does not support the shape is recorded as skipped."""
    # Never below 0.99: a dtype that loses that much would make the gate
    # meaningless, and then ROSE has to do better than transformers.
    threshold = THRESHOLD if floor is None else min(THRESHOLD, max(floor, FLOOR_LIMIT))
    records = []
    for name in backends(device):
        rec = {"model": shape.name, "backend": name, "dtype": dtype, "rows": len(sequences),
               "threshold": round(threshold, 6)}
        try:
            e = engine(model_dir, device, dtype, attention=name)
        except ValueError as err:  # the backend does not take this shape/device/dtype
            records.append({**rec, "status": "skipped", "reason": str(err)})
            continue
        except Exception as err:  # isolated: one broken backend is one record
            records.append({**rec, "status": "ERROR", "reason": f"{type(err).__name__}: {err}"})
            continue
        try:
            got = e.embed(sequences).float().numpy()
            cos = float(cosines(got, want.numpy()).min())
            records.append({**rec, "status": "passed" if cos >= threshold else "FAILED",
                            "min_cosine": round(cos, 6)})
        except Exception as err:
            records.append({**rec, "status": "ERROR", "reason": f"{type(err).__name__}: {err}"})
        del e
    return records


def gate_passed(records: list[dict]) -> bool:
    """At least one backend passed and none failed or broke."""
    return any(r["status"] == "passed" for r in records) and not any(
        r["status"] in ("FAILED", "ERROR") for r in records)


def wait_event(e, sequences: list[list[int]], want: np.ndarray, device: str) -> dict:
    """Launches a step behind a GPU sleep, waits for its event in a Python
    thread through ``tulip._native.wait_event`` (which releases the GIL),
    counts what the main thread got done meanwhile, then reads the rows
    straight from the pinned host pointer."""
    from tulip._native import wait_event as rust_wait

    from rose import Batch

    if device == "cuda" and hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(200_000_000)  # ≈0.1 s of GPU time queued before the step
    lazy = e.step(Batch.from_lists(sequences))
    handle, ptr, rows, cols = lazy.event_handle, lazy.host_ptr(), lazy.rows, lazy.cols
    done = threading.Event()
    error: list[BaseException] = []

    def waiter():
        try:
            rust_wait(handle, timeout_s=WAIT_LIMIT_S)
        except BaseException as err:  # reported below
            error.append(err)
        finally:
            done.set()

    start = time.perf_counter()
    t = threading.Thread(target=waiter)
    t.start()
    spins = 0
    # The waiter sets ``done`` whether it returns or raises; the deadline
    # only guards against a waiter that never comes back.
    deadline = time.monotonic() + WAIT_LIMIT_S
    event = getattr(lazy, "_event", None)
    while not done.is_set() and time.monotonic() < deadline:
        # Counted only while the event is pending: with the GIL held by the
        # waiter, this thread could not run then, and this stays 0.
        if event is not None and not event.query():
            spins += 1
    t.join(5)
    if not done.is_set():
        error.append(TimeoutError(f"wait_event still waiting after {WAIT_LIMIT_S}s"))
    waited = time.perf_counter() - start
    got = np.ctypeslib.as_array((ctypes.c_float * (rows * cols)).from_address(ptr)).reshape(rows, cols).copy()
    lazy.release()
    cos = float(cosines(got, want).min())
    ok = not error and cos >= REPLAY_THRESHOLD and (device != "cuda" or (handle != 0 and spins > 0))
    return {"check": "Rust event wait from another thread without the GIL", "event_handle_nonzero": handle != 0,
            "waited_ms": round(waited * 1e3, 3), "main_thread_iterations_while_pending": spins,
            "min_cosine_vs_eager": round(cos, 6), "error": repr(error[0]) if error else None,
            "status": "passed" if ok else "FAILED"}


def graph_replay(model_dir, sequences: list[list[int]], device: str, dtype: str) -> dict:
    """The same batch through a graphs engine (warm-up on the static
    buffers, capture + replay, replay, replay) against ROSE's own eager
    output in the same dtype: replay must reproduce the warm-up (same
    shapes, same kernels) and agree with eager (which computes no padding,
    so only rounding differs)."""
    from rose import Batch

    eager = engine(model_dir, device, dtype, graphs=False)
    lazy = eager.step(Batch.from_lists(sequences))
    want = lazy.tensor().clone().numpy()
    lazy.release()
    del eager
    e = engine(model_dir, device, dtype, graphs=True)
    outs, modes = [], []
    for _ in range(4):
        lazy = e.step(Batch.from_lists(sequences))
        outs.append(lazy.tensor().clone().numpy())
        modes.append(lazy.mode)
        lazy.release()
    vs_eager = float(min(cosines(o, want).min() for o in outs))
    vs_warmup = float(min(cosines(o, outs[0]).min() for o in outs[1:]))
    max_abs = float(max(np.abs(o - outs[0]).max() for o in outs[1:]))
    # CUDA graphs are only captured on CUDA; on the CPU the static path runs
    # the same bookkeeping with no graph.
    graphed = device != "cuda" or "replay" in modes
    ok = graphed and vs_warmup >= REPLAY_THRESHOLD and vs_eager >= THRESHOLD
    return {"check": "graph capture/replay equals eager (same dtype)", "dtype": dtype, "modes": modes,
            "min_cosine_vs_warmup": round(vs_warmup, 7), "max_abs_vs_warmup": max_abs,
            "min_cosine_vs_eager": round(vs_eager, 7), "status": "passed" if ok else "FAILED"}
