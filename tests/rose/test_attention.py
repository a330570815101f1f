"""Attention backends against per-sequence SDPA on random ragged inputs
(causal and bidirectional, MHA and GQA, head dims 64 and 128), the
selection table and the per-step selecting backend, and the sweep script's
dry run. GPU-only backends run where CUDA is available and skip cleanly
elsewhere."""

from __future__ import annotations

import importlib.util
import itertools
import json
from pathlib import Path

import pytest
import torch

from rose.attention import (
    DEFAULT_ORDER,
    AttnShape,
    SelectingBackend,
    SelectionTable,
    available_backends,
    get_backend,
    select_backend,
)
from rose.attention.sdpa import SdpaBackend

REPO = Path(__file__).resolve().parents[2]
LENGTHS = [1, 7, 64, 3, 200, 33, 128, 2, 90]
SHAPES = [AttnShape(8, 8, 64, False), AttnShape(8, 8, 64, True), AttnShape(8, 2, 128, False),
          AttnShape(8, 2, 128, True), AttnShape(4, 1, 64, True)]
GPU_BACKENDS = ["torch_varlen", "flash_attn", "flash_attn3", "flashinfer", "fa4"]
has_cuda = torch.cuda.is_available()


def ragged(shape: AttnShape, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    t = sum(LENGTHS)
    q = torch.randn(t, shape.num_heads, shape.head_dim, generator=g).to(device, dtype)
    k = torch.randn(t, shape.num_kv_heads, shape.head_dim, generator=g).to(device, dtype)
    v = torch.randn(t, shape.num_kv_heads, shape.head_dim, generator=g).to(device, dtype)
    cu = torch.tensor([0] + torch.tensor(LENGTHS).cumsum(0).tolist(), dtype=torch.int32, device=device)
    return q, k, v, cu


def run(backend, shape, q, k, v, cu):
    plan = backend.plan(cu, LENGTHS, max(LENGTHS), shape.causal)
    return backend.attend(q, k, v, plan, shape.head_dim ** -0.5)


def naive(shape, q, k, v):
    """Plain softmax attention per sequence in float64: the ground truth."""
    out, start = [], 0
    group = shape.num_heads // shape.num_kv_heads
    for n in LENGTHS:
        qs = q[start:start + n].double().transpose(0, 1)
        ks = k[start:start + n].double().repeat_interleave(group, 1).transpose(0, 1)
        vs = v[start:start + n].double().repeat_interleave(group, 1).transpose(0, 1)
        s = qs @ ks.transpose(1, 2) * shape.head_dim ** -0.5
        if shape.causal:
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        out.append((s.softmax(-1) @ vs).transpose(0, 1))
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_sdpa_matches_naive_attention(shape):
    q, k, v, cu = ragged(shape, "cpu", torch.float32)
    got = run(SdpaBackend(), shape, q, k, v, cu)
    assert (got.double() - naive(shape, q, k, v)).abs().max() < 1e-5


@pytest.mark.parametrize("name", sorted(available_backends("cpu")))
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_cpu_backends_agree_with_sdpa(name, shape):
    backend = select_backend(shape, torch.device("cpu"), torch.float32, name)
    q, k, v, cu = ragged(shape, "cpu", torch.float32, seed=1)
    want = run(SdpaBackend(), shape, q, k, v, cu)
    assert (run(backend, shape, q, k, v, cu) - want).abs().max() < 1e-5


@pytest.mark.gpu
@pytest.mark.skipif(not has_cuda, reason="needs a CUDA device")
@pytest.mark.parametrize("name", GPU_BACKENDS)
def test_gpu_backends_agree_with_sdpa(name):
    device = torch.device("cuda")
    backends = available_backends(device)
    if name not in backends:
        pytest.skip(f"{name} is not installed here")
    checked = 0
    for shape in SHAPES:
        for dtype in (torch.bfloat16, torch.float16):
            if not backends[name].supports(shape, device, dtype):
                continue
            backend = select_backend(shape, device, dtype, name)
            q, k, v, cu = ragged(shape, device, dtype, seed=2)
            want = run(SdpaBackend(), shape, q, k, v, cu).float()
            got = run(backend, shape, q, k, v, cu).float()
            assert (got - want).abs().max().item() < 2e-2, (shape, dtype)
            checked += 1
    if not checked:
        pytest.skip(f"{name} supports none of the test shapes on this GPU")


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="not available here.*sdpa"):
        get_backend("no-such-kernel")


@pytest.mark.skipif(has_cuda, reason="checks the CPU-only machine")
def test_cpu_never_lists_gpu_backends():
    assert set(available_backends()) == {"sdpa", "sdpa_padded", "sdpa_masked"}
    assert set(available_backends()) <= set(DEFAULT_ORDER)


def _table(cells) -> SelectionTable:
    return SelectionTable.load("test", root=Path("/nonexistent")) if cells is None else SelectionTable(cells, "test")


def test_selection_table_picks_nearest_cell():
    from rose.attention.selection import Cell

    mk = lambda h, kv, d, t, s, r: Cell(h, kv, d, False, "float32", t, s, tuple(r))  # noqa: E731
    table = SelectionTable([
        mk(16, 16, 64, 64, 1, ["sdpa_masked", "sdpa"]),
        mk(16, 16, 64, 8192, 16, ["sdpa", "sdpa_masked"]),
        mk(16, 8, 128, 64, 1, ["flash_attn", "sdpa"]),
    ])
    mha = AttnShape(16, 16, 64, False)
    assert table.rank(mha, torch.float32, 80, 1) == ("sdpa_masked", "sdpa")
    assert table.rank(mha, torch.float32, 6000, 12) == ("sdpa", "sdpa_masked")
    # Another head count with the same head dim and no GQA: same cells.
    assert table.rank(AttnShape(12, 12, 64, False), torch.float32, 70, 1)[0] == "sdpa_masked"
    assert table.rank(AttnShape(32, 8, 128, False), torch.float32, 64, 1)[0] == "flash_attn"
    assert table.rank(AttnShape(16, 16, 64, True), torch.float32, 64, 1) == ()
    assert _table(None).rank(mha, torch.float32, 64, 1) == ()


def test_selecting_backend_switches_per_step():
    from rose.attention.selection import Cell

    shape = AttnShape(4, 4, 64, False)
    table = SelectionTable([Cell(4, 4, 64, False, "float32", 16, 1, ("sdpa_masked", "sdpa")),
                            Cell(4, 4, 64, False, "float32", 1024, 8, ("sdpa", "sdpa_masked"))])
    chosen = select_backend(shape, torch.device("cpu"), torch.float32, "auto", table=table)
    assert isinstance(chosen, SelectingBackend)
    cu = torch.tensor([0, 10], dtype=torch.int32)
    assert chosen.plan(cu, [10], 10, False).backend.name == "sdpa_masked"
    cu = torch.tensor([0, 600, 1200], dtype=torch.int32)
    assert chosen.plan(cu, [600, 600], 600, False).backend.name == "sdpa"
    # Beyond the masked backend's token bound it is never chosen.
    big = SelectionTable([Cell(4, 4, 64, False, "float32", 8192, 1, ("sdpa_masked", "sdpa"))])
    chosen = select_backend(shape, torch.device("cpu"), torch.float32, "auto", table=big)
    cu = torch.tensor([0, 8000], dtype=torch.int32)
    assert chosen.plan(cu, [8000], 8000, False).backend.name == "sdpa"


def test_selection_leaves_padding_out_of_skewed_batches():
    from rose.attention.selection import Cell

    shape = AttnShape(4, 4, 64, False)
    table = SelectionTable([Cell(4, 4, 64, False, "float32", 512, 32, ("sdpa_padded", "sdpa"))])
    chosen = select_backend(shape, torch.device("cpu"), torch.float32, "auto", table=table)
    even = [16] * 32
    cu = torch.tensor([0] + list(itertools.accumulate(even)), dtype=torch.int32)
    assert chosen.plan(cu, even, 16, False).backend.name == "sdpa_padded"
    # One long sequence among short ones: padding would multiply the work.
    skewed = [256] + [8] * 31
    cu = torch.tensor([0] + list(itertools.accumulate(skewed)), dtype=torch.int32)
    assert chosen.plan(cu, skewed, 256, False).backend.name == "sdpa"


def test_committed_tables_are_well_formed():
    paths = list((REPO / "rose" / "attention" / "tables").glob("*.json"))
    if not paths:
        pytest.skip("no selection table committed yet (regenerate with bench/scripts/attention_sweep.py)")
    for path in paths:
        data = json.loads(path.read_text())
        table = SelectionTable.load(path.stem)
        assert table.cells and data["meta"]["device_kind"] == path.stem
        assert all(set(c.ranking) <= set(DEFAULT_ORDER) for c in table.cells)


def _bench(name: str):
    """A bench script as a module (run in-process: no second interpreter start-up)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name.replace('/', '_')}", REPO / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_sweep_dry_run_writes_a_loadable_table(tmp_path):
    assert _bench("scripts/attention_sweep").main(["--dry-run", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "attention_sweep.json").read_text())
    assert data["cells"] and all(c["ranking"] for c in data["cells"])
    (tmp_path / "cpu.json").write_text(json.dumps(data))
    table = SelectionTable.load("cpu", root=tmp_path)
    assert table.rank(AttnShape(12, 12, 32, False), torch.float32, 10, 1)
    assert "| model |" in (tmp_path / "attention_sweep.md").read_text()


def test_gpu_engine_check_dry_run(tmp_path):
    """The GPU check script keeps working between GPU runs."""
    assert _bench("gpu/engine_check").main(["--dry-run", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "gpu_engine_check.json").read_text())["rows"]
    assert {r["kind"] for r in rows} == {"dense", "sparse", "multi_vector"} and all(r["passed"] for r in rows)
