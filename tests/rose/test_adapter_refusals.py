"""What ROSE refuses of a LoRA adapter, each with its own message, and
leaves the engine as it was: options it does not apply (DoRA, trained
biases, modules_to_save, any other option that changes the outputs),
weights that are not plain LoRA matrices, modules it cannot adapt,
adapters of another base model, ranks and counts over the engine's
bounds; and batches that name an adapter not loaded."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

pytest.importorskip("peft")

from bench.harness.lora_adapters import edit_config, random_adapter  # noqa: E402
from rose import AdapterError, Batch, Engine, InvalidBatchError  # noqa: E402


@pytest.fixture(scope="module")
def adapter(bert_dir, models_root):
    """A rank-4 adapter of the tiny BERT's query and value."""
    return random_adapter(bert_dir, models_root / "refusals-adapter", ["query", "value"], r=4, seed=3)


def engine(model_dir, **kw) -> Engine:
    return Engine.from_dir(model_dir, device="cpu", dtype="float32", **kw)


def _weights(d, edit) -> None:
    from safetensors.torch import load_file, save_file

    path = d / "adapter_model.safetensors"
    w = load_file(str(path))
    edit(w)
    save_file(w, str(path))


Q = "base_model.model.encoder.layer.0.attention.self.query"


def _rename(old: str, new: str):
    def edit(w):
        for k in [k for k in w if old in k]:
            w[k.replace(old, new)] = w.pop(k)
    return edit


EDITS = {
    "not LoRA": (lambda d: edit_config(d, peft_type="IA3"), "peft_type 'IA3' is not LORA"),
    "DoRA": (lambda d: edit_config(d, use_dora=True), "DoRA (use_dora)"),
    "bias": (lambda d: edit_config(d, bias="lora_only"), "bias='lora_only': trained biases"),
    "lora_bias": (lambda d: edit_config(d, lora_bias=True), "trained LoRA biases (lora_bias)"),
    "modules_to_save": (lambda d: edit_config(d, modules_to_save=["pooler"]), "modules_to_save replaces whole"),
    "another option": (lambda d: edit_config(d, use_bdlora={"nblocks": 2}),
                       "sets use_bdlora={'nblocks': 2}, which ROSE does not apply"),
    "rank in config": (lambda d: edit_config(d, r=8), f"module {Q.removeprefix('base_model.model.')} has rank 4, "
                                                      "adapter_config.json says 8"),
    "DoRA weights": (lambda d: _weights(d, lambda w: w.update({f"{Q}.lora_magnitude_vector": torch.ones(64)})),
                     "is a DoRA magnitude"),
    "embedding": (lambda d: _weights(d, lambda w: w.update(
        {"base_model.model.embeddings.word_embeddings.lora_embedding_A": torch.ones(4, 30522)})),
                  "is an embedding adapter"),
    "half a pair": (lambda d: _weights(d, lambda w: w.pop(f"{Q}.lora_B.weight")), "has lora_A but not both"),
    "unknown module": (lambda d: _weights(d, _rename("self.query", "self.rotary")),
                       "target module 'attention.self.rotary' (in encoder.layer.0.attention.self.rotary) is not a "
                       "projection ROSE adapts in bert; it adapts attention.output.dense, attention.self.key"),
    "outside the layers": (lambda d: _weights(d, _rename("encoder.layer.0.attention.self.query", "embeddings.proj")),
                           "module embeddings.proj is not in a transformer layer"),
    "more layers": (lambda d: _weights(d, _rename("layer.1.", "layer.5.")),
                    "is in layer 5, and this bert model has 2 layers: the adapter was trained for another base"),
    "no weights": (lambda d: (d / "adapter_model.safetensors").unlink(),
                   "no adapter_model.safetensors or adapter_model.bin"),
    "no config": (lambda d: (d / "adapter_config.json").unlink(), "no adapter_config.json"),
}


@pytest.mark.parametrize("case", list(EDITS))
def test_refused_with_its_message(case, adapter, bert_dir, tmp_path):
    edit, message = EDITS[case]
    bad = tmp_path / "adapter"
    shutil.copytree(adapter, bad)
    edit(bad)
    e = engine(bert_dir)
    qkv = e.model.encoder.layers[0].qkv
    with pytest.raises(AdapterError, match=re.escape(message)):
        e.load_adapter("bad", bad)
    assert e.adapters() == () and e.model.encoder.layers[0].qkv is qkv
    e.load_adapter("good", adapter)  # the engine is as it was
    assert [a.name for a in e.adapters()] == ["good"]


def test_another_base_model(adapter, e5_dir):
    """The same module names with other sizes (an XLM-R of hidden 32)."""
    with pytest.raises(AdapterError, match=r"lora_A \[4, 64\] and lora_B \[64, 4\] do not fit ROSE's projection "
                                           r"\(32 inputs, 32 outputs\): the adapter was trained for another base"):
        engine(e5_dir).load_adapter("bert", adapter)


def test_bounds_and_names(adapter, bert_dir):
    with pytest.raises(AdapterError, match="has rank 4, over this engine's bound max_adapter_rank=2"):
        engine(bert_dir, max_adapter_rank=2).load_adapter("a", adapter)
    e = engine(bert_dir, max_adapters=1)
    e.load_adapter("a", adapter)
    with pytest.raises(AdapterError, match=r"1 adapters are loaded, this engine's bound \(max_adapters=1\)"):
        e.load_adapter("b", adapter)
    with pytest.raises(AdapterError, match="an adapter named 'a' is loaded already; unload it first"):
        e.load_adapter("a", adapter)
    with pytest.raises(AdapterError, match="no adapter named 'b' is loaded"):
        e.unload_adapter("b")
    for name in ("", "two words", "-leading", "x" * 129):
        with pytest.raises(AdapterError, match="is not 1 to 128 of letters, digits"):
            engine(bert_dir).load_adapter(name, adapter)
    off = engine(bert_dir, max_adapters=0)
    assert (off.info.max_adapters, off.info.max_adapter_rank) == (0, 0)
    with pytest.raises(AdapterError, match=r"adapters are off on this engine \(max_adapters=0\)"):
        off.load_adapter("a", adapter)


def test_cross_encoders_take_none(adapter, reranker_bert_dir):
    e = engine(reranker_bert_dir)
    assert e.info.max_adapters == 0
    with pytest.raises(AdapterError, match="this bert model takes no adapters: ROSE applies LoRA adapters to"):
        e.load_adapter("a", adapter)


def test_batches_naming_no_loaded_adapter(adapter, bert_dir):
    e = engine(bert_dir)
    e.load_adapter("a", adapter)
    seqs = [[101, 2023, 102], [101, 2003, 1037, 102]]
    with pytest.raises(InvalidBatchError, match="adapter 'b' is not loaded"):
        e.embed(seqs, adapters=["a", "b"])
    with pytest.raises(InvalidBatchError, match="1 adapter choices for 2 sequences"):
        e.embed(seqs, adapters=["a"])
    # The host's path checks nothing else, but a name unloaded meanwhile is refused.
    arena = Batch.from_lists(seqs, dimensions=[64, 64], normalize=[True, True]).numpy().tobytes()
    e.unload_adapter("a")
    with pytest.raises(InvalidBatchError, match="adapter 'a' is not loaded"):
        e.step_arena(bytearray(arena), 2, 7, "dense", ["a", None])
    lazy = e.step_arena(bytearray(arena), 2, 7, "dense", [None, None])[0]  # all base: a base step
    assert lazy.info.mode == "eager"
    lazy.release()
    # Unloaded (or replaced) between the step's plan and its forward pass.
    e.load_adapter("a", adapter)
    bank = e._adapters
    step = bank.step(Batch.from_lists(seqs, adapters=["a", None]))
    e.unload_adapter("a")
    e.load_adapter("a", adapter)
    with pytest.raises(InvalidBatchError, match="adapter 'a' is not loaded"):
        with bank.applied(step):
            pass
