"""oneDNN-packed linear layers on the CPU (rose/models/packed.py): the same
results as ``nn.Linear`` at float32, the weight still readable, only float32
CPU layers packed, and an engine that packs them embeds as one that does
not (the architecture tests compare packed engines with transformers)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rose import Engine
from rose.models import packed

pytestmark = pytest.mark.skipif(not packed.available(), reason="this PyTorch has no oneDNN packed linear")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 48), (16, 48), (17, 48), (333, 48), (2, 7, 48), (3, 100, 48), (0, 48)])
def test_packed_matches_nn_linear(bias, shape):
    torch.manual_seed(0)
    lin = nn.Linear(48, 80, bias=bias)
    x = torch.randn(*shape)
    want = lin(x)
    p = packed.PackedLinear(lin)
    with torch.inference_mode():
        got = p(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # A strided (transposed) input gives the same rows.
    xt = torch.randn(48, 5).t()
    torch.testing.assert_close(p(xt), lin(xt), rtol=1e-5, atol=1e-5)


def test_rows_are_padded_to_few_sizes_and_never_cut():
    sizes = {packed.padded_rows(n) for n in range(1, 4097)}
    assert all(packed.padded_rows(n) >= n for n in range(0, 9000))
    assert [packed.padded_rows(n) for n in (0, 1, 16, 17, 256, 257, 300, 4096, 4097)] == [
        0, 1, 16, 32, 256, 288, 320, 4096, 4608]
    assert max(packed.padded_rows(n) / n for n in range(257, 9000)) <= 1.125
    assert len(sizes) <= 64


def test_the_weight_stays_readable_and_only_marked_layers_keep_a_copy():
    lin = nn.Linear(32, 64)
    p = packed.PackedLinear(lin)
    assert p.kept is None and torch.equal(p.weight, lin.weight.detach())
    marked = nn.Linear(32, 64)
    marked.weight_read_directly = True
    q = packed.PackedLinear(marked)
    assert q.weight is q.kept and torch.equal(q.weight, marked.weight.detach())


def test_only_float32_cpu_linears_are_packed():
    model = nn.Sequential(nn.Linear(8, 8), nn.Sequential(nn.Linear(8, 8), nn.ReLU()),
                          nn.Linear(8, 8).to(torch.float16), nn.LayerNorm(8))
    assert packed.pack_linears(model) == 2
    assert isinstance(model[0], packed.PackedLinear) and isinstance(model[1][0], packed.PackedLinear)
    assert type(model[2]) is nn.Linear and type(model[3]) is nn.LayerNorm


def test_a_packed_engine_embeds_as_an_unpacked_one(minilm_dir):
    texts = [[101, 7592, 2088, 102], [101] + list(range(2000, 2040)) + [102], [101, 102]]
    on = Engine.from_dir(minilm_dir, device="cpu", packed_linear=True)
    off = Engine.from_dir(minilm_dir, device="cpu", packed_linear=False)
    assert any(isinstance(m, packed.PackedLinear) for m in on.model.modules())
    assert not any(isinstance(m, packed.PackedLinear) for m in off.model.modules())
    for kind in ("dense", "token_states"):
        a, b = on.embed(texts, kind), off.embed(texts, kind)
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_packing_turns_pytorchs_own_onednn_dispatch_off():
    torch.backends.mkldnn.enabled = True
    try:
        assert packed.pack_linears(nn.Sequential(nn.Linear(8, 8))) == 1
        assert not torch.backends.mkldnn.enabled
    finally:
        torch.backends.mkldnn.enabled = True


# Runs in a child process: ONEDNN_VERBOSE is read when oneDNN starts.
_RAGGED_STEPS = """
import random, torch
from rose import Engine
torch.set_num_threads(1)
engine = Engine.from_dir({model!r}, device="cpu")
rng = random.Random(0)
for n in (1, 3, 7, 20):
    for _ in range(4):
        engine.embed([[101] + [rng.randrange(1000, 20000) for _ in range(rng.randrange(1, 120))] + [102]
                      for _ in range(n)])
"""


def test_ragged_batches_reach_onednn_only_at_padded_sizes(minilm_dir):
    """Every oneDNN kernel a packed MiniLM runs over ragged batches is a
    matmul at one of the padded row counts (or the load-time weight
    packing): no GELU or other kernel per exact shape, whose churn through
    the primitive cache fragmented Tulip's heap."""
    import os
    import re
    import subprocess
    import sys

    env = dict(os.environ, ONEDNN_VERBOSE="1")
    out = subprocess.run([sys.executable, "-c", _RAGGED_STEPS.format(model=minilm_dir)], env=env,
                         capture_output=True, text=True, timeout=300, check=True).stdout
    execs = [line.split(",") for line in out.splitlines() if line.startswith("onednn_verbose,v1,primitive,exec,")]
    kinds = {e[5] for e in execs}
    assert "eltwise" not in kinds and kinds <= {"inner_product", "matmul", "reorder"}, kinds
    rows = {int(m.group(1)) for e in execs for m in [re.search(r"\bmb(\d+)", ",".join(e))] if m}
    rows |= {int(m.group(1)) for e in execs if e[5] == "matmul"
             for m in [re.search(r"(\d+)x\d+:", ",".join(e))] if m}
    assert rows, "no matmul ran on oneDNN"
    assert all(packed.padded_rows(r) == r for r in rows), sorted(rows)
