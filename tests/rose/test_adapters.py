"""LoRA adapters in ROSE (``rose/adapters``, ``rose/step/lora.py``): for
every family that takes them, a seeded random PEFT adapter served by ROSE
matches PEFT's merged model through sentence-transformers (cosine 0.999);
sequences of several adapters and of the base model share a step and get
what they get alone; the base model is unchanged by loading and
unloading; adapter steps never reach the CPU's gated runtimes or the
static buffers; the simulated device charges their work."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("peft")

from bench.harness.lora_adapters import merged_st, random_adapter  # noqa: E402
from bench.harness.tiny_models import (  # noqa: E402
    tiny_bert,
    tiny_modernbert,
    tiny_mpnet,
    tiny_nomic_bert,
    tiny_qwen3,
    tiny_xlmr,
)
from rose import Batch, Engine  # noqa: E402
from tests.support.reference import assert_close_vectors, st_inputs  # noqa: E402

from .conftest import tokenize  # noqa: E402

# Family → (its tiny model, the adapter's LoraConfig): between them, PEFT's
# defaults (query/value, q_proj/v_proj), every projection of each family,
# fused parts adapted alone and together, rsLoRA and per-module ranks and
# alphas.
FAMILIES = {
    "bert": (lambda d: tiny_bert(d, seed=21), {"targets": ["query", "value", "dense"]}),
    "xlmr": (lambda d: tiny_xlmr(d, seed=22, m3_heads=False), {"targets": None}),
    "mpnet": (lambda d: tiny_mpnet(d, seed=23), {"targets": ["k", "o", "intermediate.dense", "output.dense"]}),
    "modernbert": (lambda d: tiny_modernbert(d, seed=24), {"targets": ["Wqkv", "Wo", "Wi"]}),
    "nomic": (lambda d: tiny_nomic_bert(d, seed=25),
              {"targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]}),
    "qwen3": (lambda d: tiny_qwen3(d, seed=26),
              {"targets": ["q_proj", "k_proj", "v_proj", "gate_proj", "down_proj"], "use_rslora": True,
               "rank_pattern": {"k_proj": 2}, "alpha_pattern": {"v_proj": 16}}),
}


def engine(model_dir, **kw) -> Engine:
    return Engine.from_dir(model_dir, device="cpu", dtype="float32", **kw)


@pytest.fixture(scope="module")
def family_dirs(models_root):
    return {}


def _family(name, models_root, cache) -> tuple:
    if name not in cache:
        build, kw = FAMILIES[name]
        model_dir = build(models_root / f"lora-{name}")
        kw = dict(kw)
        adapter = random_adapter(model_dir, models_root / f"lora-{name}-adapter", kw.pop("targets"), seed=7, **kw)
        cache[name] = (model_dir, adapter)
    return cache[name]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_adapter_matches_peft_merged(family, models_root, family_dirs, texts):
    model_dir, adapter = _family(family, models_root, family_dirs)
    st = merged_st(model_dir, adapter)
    want = st.encode(texts, convert_to_tensor=True).float()
    seqs = st_inputs(st, texts)
    e = engine(model_dir)
    base = e.embed(seqs)
    e.load_adapter("tuned", adapter)
    got = e.embed(seqs, adapters=["tuned"] * len(seqs))
    assert_close_vectors(got, want)
    # The adapter matters: the base model is far from PEFT's merged one.
    assert F.cosine_similarity(base.double(), want.double()).min() < 0.99
    assert e.runner.stats.steps["lora"] == 1


def test_nomic_original_layout(models_root, family_dirs, texts, tmp_path):
    """An adapter named as nomic's own remote code names its modules
    (Wqkv, out_proj, fc11 = up, fc12 = gate, fc2) serves as its
    transformers-named twin: q/k/v become one Wqkv adapter of rank 3r
    (A's stacked, B's block-diagonal, alpha 3x so the scale is the same)."""
    from safetensors.torch import load_file, save_file

    from bench.harness.lora_adapters import edit_config

    model_dir, adapter = _family("nomic", models_root, family_dirs)
    w = load_file(str(adapter / "adapter_model.safetensors"))
    out, p = {}, "base_model.model.layers."
    for i in range(2):
        qkv = [f"{p}{i}.self_attn.{n}_proj" for n in "qkv"]
        a = torch.cat([w.pop(f"{m}.lora_A.weight") for m in qkv])
        b = torch.block_diag(*[w.pop(f"{m}.lora_B.weight") for m in qkv])
        out[f"base_model.model.encoder.layers.{i}.attn.Wqkv.lora_A.weight"] = a
        out[f"base_model.model.encoder.layers.{i}.attn.Wqkv.lora_B.weight"] = b
    renames = {"self_attn.o_proj": "attn.out_proj", "mlp.up_proj": "mlp.fc11", "mlp.gate_proj": "mlp.fc12",
               "mlp.down_proj": "mlp.fc2"}
    for key, t in w.items():
        for new, old in renames.items():
            key = key.replace(new, old)
        out[key.replace(p, "base_model.model.encoder.layers.")] = t.contiguous()
    original = tmp_path / "nomic-original"
    original.mkdir()
    save_file(out, str(original / "adapter_model.safetensors"))
    (original / "adapter_config.json").write_text((adapter / "adapter_config.json").read_text())
    edit_config(original, target_modules=["Wqkv", "out_proj", "fc11", "fc12", "fc2"], rank_pattern={"Wqkv": 12},
                alpha_pattern={"Wqkv": 24})
    seqs = st_inputs(merged_st(model_dir), texts[:6])
    e = engine(model_dir)
    e.load_adapter("transformers", adapter)
    e.load_adapter("original", original)
    assert_close_vectors(e.embed(seqs, adapters=["original"] * 6), e.embed(seqs, adapters=["transformers"] * 6),
                         min_cosine=0.99999)


@pytest.fixture(scope="module")
def bert_two(models_root, family_dirs):
    """The BERT model with two adapters of different targets and ranks."""
    model_dir, first = _family("bert", models_root, family_dirs)
    second = random_adapter(model_dir, models_root / "lora-bert-second", ["query", "key", "value", "output.dense"],
                            r=8, alpha=4, seed=8)
    return model_dir, first, second


def test_mixed_step_equals_each_alone(bert_two, models_root, texts):
    """Adapters and the base model in one step, each adapter's sequences
    both in one run (a range of rows) and scattered (indices), one adapter
    on a part of a fused projection alone (the key of qkv): every row is
    what its sequence gets alone."""
    model_dir, first, second = bert_two
    third = random_adapter(model_dir, models_root / "lora-bert-key", ["key"], r=2, seed=9)
    seqs = st_inputs(merged_st(model_dir), texts[:9])
    e = engine(model_dir)
    e.load_adapter("a", first)
    e.load_adapter("b", second)
    e.load_adapter("c", third)
    choices = [["a", "c", "b", None, "b", "a", None, "c", "b"], ["a", "a", "a", "b", "b", None, None, None, "a"]]
    for choice in choices:
        got = e.embed(seqs, adapters=choice)
        for i, (s, name) in enumerate(zip(seqs, choice)):
            alone = e.embed([s], adapters=[name])[0]
            assert torch.allclose(got[i], alone, atol=2e-6), (choice, i)
    # Base sequences alone run as base steps.
    assert e.runner.stats.steps["lora"] == 2 + sum(n is not None for c in choices for n in c)


@pytest.mark.parametrize("kind", ["dense", "sparse", "multi_vector", "token_states"])
def test_reordered_step_rows_in_batch_order(kind, xlmr_dir, models_root, texts):
    """A step whose adapters' sequences are scattered runs them in adapter
    order and puts every kind's rows (one per sequence, one per token, one
    per token after the first) back in the batch's order."""
    adapter = models_root / "lora-m3-adapter"
    if not adapter.is_dir():
        random_adapter(xlmr_dir, adapter, None, seed=11)
    seqs = tokenize(xlmr_dir, texts[:7])
    choice = ["a", None, "a", "b", None, "a", "b"]
    e = engine(xlmr_dir)
    e.load_adapter("a", adapter)
    e.load_adapter("b", adapter)  # the same matrices under a second name
    got = e.embed(seqs, kind, adapters=choice)
    lazy = e.step(Batch.from_lists(seqs, kind, adapters=choice))
    assert lazy.info.mode == "lora"
    lazy.release()
    alone = torch.cat([e.embed([s], kind, adapters=[n]) for s, n in zip(seqs, choice)])
    assert got.shape == alone.shape and torch.allclose(got, alone, atol=2e-5)


def test_base_unchanged_by_load_and_unload(bert_two, texts):
    """Loading adapters leaves base steps bit-identical; unloading the last
    one puts the model's own modules back."""
    model_dir, first, second = bert_two
    seqs = st_inputs(merged_st(model_dir), texts[:5])
    e = engine(model_dir)
    layer = e.model.encoder.layers[0]
    own = {n: getattr(layer, n) for n in ("qkv", "attn_out", "ffn_in", "ffn_out")}
    base = e.embed(seqs)
    e.load_adapter("a", first)
    e.load_adapter("b", second)
    assert type(layer.qkv).__name__ == "LoraLinear"
    assert torch.equal(e.embed(seqs), base)
    assert torch.equal(e.embed(seqs, adapters=[None] * 5), base)
    e.unload_adapter("a")
    assert torch.equal(e.embed(seqs), base)
    assert layer.ffn_in is own["ffn_in"]  # only "a" adapted it
    e.unload_adapter("b")
    assert all(getattr(layer, n) is m for n, m in own.items())
    assert torch.equal(e.embed(seqs), base)
    assert e.adapters() == ()
    assert e.runner.stats.steps["lora"] == 0


def test_listing_and_info(bert_two):
    model_dir, first, second = bert_two
    e = engine(model_dir, max_adapters=3, max_adapter_rank=16)
    assert (e.info.max_adapters, e.info.max_adapter_rank) == (3, 16)
    assert "lora" in e.info.step_modes
    e.load_adapter("a", first)
    e.load_adapter("org/b", second)
    a, b = e.adapters()
    assert (a.name, a.rank, a.alpha, a.layers) == ("a", 4, 8.0, 2)
    # BERT's pooler, which PEFT's "dense" adapts too, is read by no output.
    assert a.targets == ("attention.output.dense", "attention.self.query", "attention.self.value",
                         "intermediate.dense", "output.dense")
    # PEFT's "output.dense" is both the attention's and the FFN's.
    assert (b.name, b.rank, b.targets) == ("org/b", 8, ("attention.output.dense", "attention.self.key",
                                                         "attention.self.query", "attention.self.value",
                                                         "output.dense"))
    # A and B of four 64 -> 64 projections and one 128 -> 64, in 2 layers.
    assert b.parameters == 2 * 8 * (4 * (64 + 64) + (128 + 64))
    assert a.to_dict()["name"] == "a"


def test_adapter_steps_skip_the_fast_paths(bert_two, texts):
    """An adapter step goes to the adapter runtime before the CPU's gated
    runtimes and the static buffers are offered it: never run there, never
    kept as a gate's reference; base steps still reach them."""
    from rose.build import assemble
    from rose.cpu.device import CpuDevice
    from rose.cpu.threads import ThreadBudget
    from rose.step.graphs import Dispatcher, GraphSettings

    class Spy:
        labels = ("spy",)
        reference = False

        def __init__(self):
            self.offered, self.observed = 0, 0

        def run(self, batch):
            self.offered += 1

        def observe(self, batch, lazy):
            self.observed += 1

    model_dir, first, _ = bert_two
    seqs = st_inputs(merged_st(model_dir), texts[:3])
    e = engine(model_dir, static_on_cpu=True)
    spy = Spy()
    bank = e._adapters
    e.runner = assemble(CpuDevice(e.model, e.backend, ThreadBudget(16)), e.info.dimension, True, [spy],
                        Dispatcher(GraphSettings(), enabled=True), bank)
    e.load_adapter("a", first)
    want = e.embed(seqs, adapters=["a", None, "a"])
    for _ in range(3):  # warm-up, capture, replay of the configuration
        e.embed(seqs)
    assert spy.offered == 3
    assert torch.allclose(e.embed(seqs, adapters=["a", None, "a"]), want, atol=2e-6)
    assert spy.offered == 3 and spy.observed == 3  # the eager reference reached it, as before; lora did not
    steps = e.runner.stats.steps
    assert (steps["lora"], steps["warmup"], steps["capture"], steps["replay"]) == (2, 1, 1, 1)


def test_simulated_device_charges_adapter_work(bert_two):
    """On the simulated device an adapter loads (read, checked, placed; the
    model has no weights) and its step costs ``a`` per adapted token times
    the adapter's share of the linear work."""
    from rose.sim.engine import SimEngine

    model_dir, first, _ = bert_two
    e = SimEngine.from_dir(model_dir, graphs=False)
    e.load_adapter("a", first)
    share = e._adapters._resident["a"].share
    assert 0 < share < 1
    seqs = [[101, 2000 + i, 102] for i in range(4)]
    busy = []
    for choice in (None, ["a", None, "a", "a"]):
        before = e.stream.busy_ns
        lazy = e.step(Batch.from_lists(seqs, adapters=choice))
        lazy.synchronize()
        busy.append(e.stream.busy_ns - before)
        assert lazy.info.mode == ("eager" if choice is None else "lora")
        lazy.release()
    assert busy[1] - busy[0] == pytest.approx(e.settings.cost.a * 9 * share * 1e9, abs=2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_adapter_steps_beside_captured_graphs(bert_two, texts):
    """On CUDA (bfloat16): a step with adapters runs eagerly while base
    steps replay their captured graph, with the wrappers in place; its rows
    track the CPU's float32 ones, scattered choices included."""
    model_dir, first, second = bert_two
    seqs = st_inputs(merged_st(model_dir), texts[:5])
    choice = ["a", None, "b", "a", None]
    cpu = engine(model_dir)
    e = Engine.from_dir(model_dir, device="cuda", dtype="bfloat16")
    for eng in (cpu, e):
        eng.load_adapter("a", first)
        eng.load_adapter("b", second)
    want = cpu.embed(seqs, adapters=choice)
    for _ in range(3):  # warm-up, capture, replay
        base = e.embed(seqs)
    assert_close_vectors(e.embed(seqs, adapters=choice).float(), want, min_cosine=0.99)
    assert torch.equal(e.embed(seqs), base)
    steps = e.runner.stats.steps
    assert (steps["lora"], steps["capture"], steps["replay"]) == (1, 1, 2)
