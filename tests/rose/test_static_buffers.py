"""The static-buffer (CUDA graph) path on the CPU: padding to a bucket never
changes a real sequence's output, and warm-up / capture / replay give the
same results as the eager path, batch after batch through the same buffers."""

from __future__ import annotations

import random

import pytest
import torch

from rose import Batch, Engine, OutputKind
from rose.interface import Layout
from rose.step.graphs import State
from rose.step.inputs import repack, resolve_defaults, step_inputs


@pytest.fixture(scope="module")
def engines(minilm_dir):
    eager = Engine.from_dir(minilm_dir, device="cpu", dtype="float32")
    static = Engine.from_dir(minilm_dir, device="cpu", dtype="float32", static_on_cpu=True)
    return eager, static


def random_batch(rng: random.Random, n: int, max_len: int) -> Batch:
    seqs = [[101] + [rng.randrange(1000, 29000) for _ in range(rng.randint(0, max_len - 2))] + [102]
            for _ in range(n)]
    dims = [rng.choice([0, 0, 32, 384]) for _ in range(n)]
    norm = [rng.random() < 0.7 for _ in range(n)]
    return Batch.from_lists(seqs, dimensions=dims, normalize=norm)


def run(engine: Engine, batch: Batch) -> torch.Tensor:
    out = engine.step(batch)
    try:
        return out.tensor().clone()
    finally:
        out.release()


def test_padding_never_changes_real_outputs(engines):
    eager, _ = engines
    model, backend = eager.model, eager.backend
    batch = random_batch(random.Random(1), 5, 40)
    resolve_defaults(batch, 384, True)
    outs = []
    for padded in (None, batch.num_tokens + 1, 256):
        if padded is None:
            layout, arena = batch.layout, batch.arena
        else:
            layout = Layout.of(batch.num_sequences, batch.num_tokens, padded)
            arena = torch.empty(layout.size, dtype=torch.int32)
            repack(batch, layout, arena, 384)
        lengths = (torch.diff(layout.views(arena)["cu"])).tolist()
        with torch.inference_mode():
            out = model(OutputKind.DENSE, step_inputs(arena, layout, backend, False, lengths, layout.tokens))
        outs.append(out[: batch.num_sequences])
    assert outs[1].shape == outs[0].shape
    for o in outs[1:]:
        assert (o - outs[0]).abs().max().item() <= 1e-5


def test_static_path_equals_eager_through_every_state(engines):
    eager, static = engines
    rng = random.Random(7)
    # Same configuration (3 sequences, same bucket) hit repeatedly with
    # different contents: warm-up, capture, then replays.
    for i in range(5):
        batch = random_batch(rng, 3, 20)
        want = run(eager, batch)
        got = run(static, batch)
        assert got.shape == want.shape == (3, 384)
        assert (got - want).abs().max().item() <= 1e-5, f"hit {i}"
    key = static.runner.dispatcher.key(OutputKind.DENSE, 3, batch.num_tokens)
    assert static.runner.dispatcher.state(key) is State.CAPTURED
    steps = static.runner.stats.steps
    assert steps["warmup"] >= 1 and steps["capture"] >= 1 and steps["replay"] >= 3


def test_static_path_mixed_configurations(engines):
    eager, static = engines
    rng = random.Random(11)
    for _ in range(12):
        batch = random_batch(rng, rng.randint(1, 6), rng.choice([8, 60, 200]))
        assert (run(static, batch) - run(eager, batch)).abs().max().item() <= 1e-5


def test_batches_beyond_the_grid_run_eagerly(minilm_dir):
    from rose.step.graphs import GraphSettings

    e = Engine.from_dir(minilm_dir, device="cpu", static_on_cpu=True,
                        graph_settings=GraphSettings(max_tokens=128, max_sequences=2))
    run(e, Batch.from_lists([[101, 102]] * 3))  # too many sequences
    run(e, Batch.from_lists([[101] + [1000] * 198 + [102]]))  # too many tokens
    assert e.runner.stats.steps["eager"] == 2
    assert e.runner.stats.steps["warmup"] == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_graph_replay_equals_eager_on_cuda(bert_dir):
    """Every graph-capable backend, in a dtype it supports (fp32 where it
    can, else bf16), against eager in that same dtype, on a tiny random
    model (no downloaded model on the GPU machine)."""
    from rose.attention import AttnShape, available_backends

    cuda = torch.device("cuda")
    shape = AttnShape(num_heads=4, num_kv_heads=4, head_dim=16, causal=False)  # tiny_bert's
    cases = []
    for name, b in available_backends(cuda).items():
        if not b.capture_safe or b.pads_to_longest:  # the latter stays eager under graphs
            continue
        dtype = next((d for d in (torch.float32, torch.bfloat16) if b.supports(shape, cuda, d)), None)
        if dtype is not None:
            cases.append((name, str(dtype).removeprefix("torch.")))
    if not cases:
        pytest.skip("no capture-safe attention backend supports the tiny model here")
    rng = random.Random(5)
    batches = [random_batch(rng, n, 60) for n in (1, 1, 1, 3, 3, 3, 3)]
    for name, dtype in cases:
        eager = Engine.from_dir(bert_dir, device="cuda", dtype=dtype, attention=name, graphs=False)
        graphs = Engine.from_dir(bert_dir, device="cuda", dtype=dtype, attention=name)
        for b in batches:
            want, got = run(eager, b), run(graphs, b)
            cos = torch.nn.functional.cosine_similarity(got, want, dim=1)
            assert cos.min().item() >= (0.9999 if dtype == "float32" else 0.999), (name, dtype)
        assert graphs.runner.stats.steps["replay"] >= 2, name
