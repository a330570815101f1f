"""Seeded random LoRA adapters in PEFT's format (``adapter_config.json`` +
``adapter_model.safetensors``) for a model directory, and the reference
that judges an engine serving them: sentence-transformers on the model
with PEFT's ``merge_and_unload`` weights. For the tests and the ``lora``
benchmark; needs ``peft``.

PEFT starts B at zero (an untrained adapter changes nothing), so every
matrix is drawn here instead: A at std ``1/sqrt(in)``, B at ``0.2 /
sqrt(r)``, which moves the outputs about as much as the base layer does.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def random_adapter(model_dir, out, targets: list[str] | None = None, r: int = 4, alpha: float = 8,
                   seed: int = 0, **config) -> Path:
    """An adapter for ``model_dir`` (its transformers model, as
    sentence-transformers loads it) on ``targets`` (None: PEFT's default
    for the architecture), saved in ``out``; ``config``: more LoraConfig
    fields (``use_rslora``, ``rank_pattern``, ...)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModel

    model = AutoModel.from_pretrained(str(model_dir))
    cfg = LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, init_lora_weights=False, **config)
    peft = get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if ".lora_A." in name:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[1] ** -0.5)
            elif ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2 * p.shape[1] ** -0.5)
    out = Path(out)
    peft.save_pretrained(str(out))
    return out


def merged_st(model_dir, adapter_dir=None):
    """``model_dir``'s SentenceTransformer on the CPU, with the adapter in
    ``adapter_dir`` merged into its weights by PEFT (None: the base)."""
    from sentence_transformers import SentenceTransformer

    st = SentenceTransformer(str(model_dir), device="cpu")
    if adapter_dir is not None:
        from peft import PeftModel

        # PEFT wraps the transformer's modules in place and merging puts
        # plain ones back: the SentenceTransformer holds the merged model.
        PeftModel.from_pretrained(st[0].auto_model, str(adapter_dir)).merge_and_unload()
    return st.eval()


def edit_config(adapter_dir, **fields) -> None:
    """Rewrites fields of an adapter's adapter_config.json (tests of what
    ROSE refuses)."""
    path = Path(adapter_dir) / "adapter_config.json"
    cfg = json.loads(path.read_text())
    cfg.update(fields)
    path.write_text(json.dumps(cfg, indent=2))


def halves(count: int = 16) -> list[tuple[str, str]]:
    """(first half, second half) of the corpus's first ``count`` English
    passages (MIRACL lines 61-80), cut at the middle word: what the shipped
    MiniLM adapter was trained to pair."""
    from bench.harness.fixtures import corpus_lines

    out = []
    for line in corpus_lines("calibration_miracl.txt")[60:60 + count]:
        words = line.split()[:120]
        out.append((" ".join(words[:len(words) // 2]), " ".join(words[len(words) // 2:])))
    return out


def train_minilm_adapter(model_dir, out, steps: int = 30, seed: int = 0) -> Path:
    """A real LoRA adapter (rank 4 on query and value, PEFT's default for
    BERT) trained on ``model_dir`` (all-MiniLM-L6-v2) to match each of
    ``halves()``'s passages' first half to its second among all of them
    (in-batch contrastive loss, temperature 0.05, AdamW 2e-3, ``steps`` full
    batches, seeded, CPU): ``tests/data/adapters/minilm-halves``."""
    import torch.nn.functional as F
    from peft import LoraConfig, get_peft_model
    from sentence_transformers import SentenceTransformer

    torch.manual_seed(seed)
    st = SentenceTransformer(str(model_dir), device="cpu")
    peft = get_peft_model(st[0].auto_model, LoraConfig(r=4, lora_alpha=8, target_modules=["query", "value"]))
    st[0].auto_model = peft
    pairs = halves()
    a = st.tokenize([p for p, _ in pairs])
    b = st.tokenize([q for _, q in pairs])
    opt = torch.optim.AdamW([p for p in peft.parameters() if p.requires_grad], lr=2e-3)
    st.train()
    for _ in range(steps):
        x, y = st(dict(a))["sentence_embedding"], st(dict(b))["sentence_embedding"]
        logits = F.normalize(x, dim=-1) @ F.normalize(y, dim=-1).T / 0.05
        loss = F.cross_entropy(logits, torch.arange(len(pairs)))
        opt.zero_grad()
        loss.backward()
        opt.step()
    out = Path(out)
    peft.save_pretrained(str(out))
    (out / "README.md").unlink(missing_ok=True)  # PEFT's model card template: tests/data/README.md says what it is
    edit_config(out, base_model_name_or_path="sentence-transformers/all-MiniLM-L6-v2")
    return out


if __name__ == "__main__":
    import sys

    from tulip.launcher import default_model_dir

    # python -m bench.harness.lora_adapters OUT_DIR: rebuilds tests/data/adapters/minilm-halves.
    print(train_minilm_adapter(default_model_dir(), sys.argv[1]))
