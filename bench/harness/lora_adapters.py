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
