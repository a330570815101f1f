"""The host's step path (``Engine.step_arena``, what Tulip calls): the same
rows as ``step`` for the same arena, every field the host reads in one
tuple, and the per-thread set-up staying on the host's own threads."""

from __future__ import annotations

import threading

import torch

from rose import Batch, Engine, OutputKind


def arena_of(engine: Engine, seqs: list[list[int]], dims: list[int], norm: list[bool]) -> bytes:
    """An arena as a host builds it: options resolved."""
    batch = Batch.from_lists(seqs, dimensions=dims, normalize=norm)
    return batch.arena.numpy().tobytes()


def on_a_new_thread(fn):
    box = {}

    def target():
        box["value"] = fn()

    t = threading.Thread(target=target)
    t.start()
    t.join()
    return box["value"]


def test_step_arena_matches_step_and_describes_its_output(minilm_dir):
    engine = Engine.from_dir(minilm_dir, device="cpu", dtype="float32")
    seqs = [[101, 7592, 2088, 102], [101, 2023, 2003, 1037, 3231, 102], [101, 102]]
    dims, norm = [384, 32, 384], [True, False, True]
    raw = arena_of(engine, seqs, dims, norm)
    tokens = sum(map(len, seqs))

    def host_step():
        lazy, ptr, rows, cols, event, mode, padded, capture_s = engine.step_arena(
            bytearray(raw), len(seqs), tokens, "dense")
        try:
            got = lazy.tensor().clone()
            return got, ptr == lazy.host_ptr(), (rows, cols, event, mode, padded, capture_s)
        finally:
            lazy.release()

    got, ptr_ok, fields = on_a_new_thread(host_step)
    expected = engine.step(Batch.from_lists(seqs, dimensions=dims, normalize=norm))
    try:
        want = expected.tensor().clone()
    finally:
        expected.release()
    assert ptr_ok
    assert fields == (3, 384, 0, "eager", tokens, 0.0)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    assert torch.count_nonzero(got[1, 32:]) == 0  # Matryoshka 32 kept from the arena


def test_host_thread_set_up_stays_on_that_thread(minilm_dir):
    engine = Engine.from_dir(minilm_dir, device="cpu", dtype="float32")
    raw = arena_of(engine, [[101, 7592, 102]], [384], [True])

    def host_step():
        out = engine.step_arena(bytearray(raw), 1, 3, OutputKind.DENSE.value)
        out[0].release()
        return torch.is_inference_mode_enabled()

    assert on_a_new_thread(host_step) is True
    # The caller's own thread (a Python user of the engine) is untouched.
    assert torch.is_inference_mode_enabled() is False
    assert torch.ones(1, requires_grad=True).mul(2).requires_grad


def test_a_host_thread_selects_the_device_only_when_one_is_named(monkeypatch):
    """Plain "cuda" means the current device (torch.cuda.set_device refuses
    a device without an index); "cuda:1" is selected at start-up and on
    each host thread."""
    from rose.step.device import CudaDevice
    from rose.step.graphs import Dispatcher, GraphSettings
    from rose.step.runner import Runner

    selected = []
    monkeypatch.setattr(torch.cuda, "set_device", selected.append)
    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: None)
    for device in (torch.device("cuda"), torch.device("cuda", 1)):
        runner = Runner(CudaDevice(None, None, device), [], Dispatcher(GraphSettings(), False), 384, True)
        runner._run = lambda batch: "ran"
        assert on_a_new_thread(lambda r=runner: r.run_on_host_thread("batch")) == "ran"
    assert selected == [torch.device("cuda", 1)] * 2
