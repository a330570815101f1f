"""CLIP and SigLIP (``rose/models/vit.py``, ``rose/models/clip.py``)
against transformers' ``get_image_features`` / ``get_text_features`` on
seeded random weights, CPU, float32: images, texts, their similarity
matrix, and batches against each item alone."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from bench.harness.tiny_models import tiny_dual_encoder
from rose.attention import get_backend
from rose.errors import InvalidBatchError, ModelLoadError
from rose.models.clip import ClipModel, attn_shapes
from tests.support.reference import assert_close_vectors

# Token ids of the tiny vocabulary (1000): CLIP's bos 998, eos 999, pad 1.
TEXTS = [
    [998, 5, 17, 300, 999],
    [998, 42, 999],
    [998, 7, 7, 7, 7, 200, 12, 13, 14, 999],
    # An end-of-text token mid-sequence: the first one is pooled and, the
    # attention being causal, nothing after it changes the result.
    [998, 600, 999, 3, 999, 1, 1],
    [998, 999],
    [998, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 999],
    # No end-of-text token: legacy CLIP pools the largest id (900), current
    # CLIP the first position (transformers' argmax over no match).
    [5, 900, 3],
]
BACKENDS = ("sdpa", "sdpa_padded", "sdpa_masked")
MAX_DIFF = 1e-4


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dual")
    return {
        "clip": tiny_dual_encoder(root / "clip", seed=0),
        # Pre-PR-24773 configs (eos_token_id 2) pool the largest id's state.
        "clip-legacy": tiny_dual_encoder(root / "clip-legacy", seed=1, eos_token_id=2),
        "siglip": tiny_dual_encoder(root / "siglip", seed=2, family="siglip"),
    }


@pytest.fixture(scope="module")
def references(model_dirs):
    """transformers' models, loaded once per directory."""
    from transformers import AutoModel

    return {
        name: AutoModel.from_pretrained(str(d), attn_implementation="eager").eval() for name, d in model_dirs.items()
    }


def features(out) -> torch.Tensor:
    """transformers 5 returns a ``BaseModelOutputWithPooling`` whose
    ``pooler_output`` holds the projected features; 4.x returned the tensor."""
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def pixels(n: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


@torch.inference_mode()
def reference_images(ref, images: torch.Tensor) -> torch.Tensor:
    return features(ref.get_image_features(pixel_values=images))


@torch.inference_mode()
def reference_texts(ref, texts: list[list[int]]) -> torch.Tensor:
    """Each sequence alone (no padding: SigLIP pools the last position,
    whatever is there)."""
    return torch.cat([features(ref.get_text_features(input_ids=torch.tensor([s]))) for s in texts])


def assert_matches(got: torch.Tensor, want: torch.Tensor) -> None:
    assert_close_vectors(got, want)
    assert (got - want).abs().max().item() <= MAX_DIFF


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", ["clip", "clip-legacy", "siglip"])
def test_features_match_transformers(model_dirs, references, name, backend):
    model = ClipModel.from_dir(model_dirs[name], get_backend(backend, "cpu"))
    ref = references[name]
    images = pixels(5, model.image_size)
    got_img, want_img = model.embed_images(images), reference_images(ref, images)
    got_txt, want_txt = model.embed_texts(TEXTS), reference_texts(ref, TEXTS)
    assert got_img.shape == (5, model.dimension) and got_txt.shape == (len(TEXTS), model.dimension)
    assert_matches(got_img, want_img)
    assert_matches(got_txt, want_txt)
    sim = F.normalize(got_img, dim=-1) @ F.normalize(got_txt, dim=-1).T
    want_sim = F.normalize(want_img, dim=-1) @ F.normalize(want_txt, dim=-1).T
    assert (sim - want_sim).abs().max().item() <= MAX_DIFF


def test_clip_text_matches_a_padded_batch(model_dirs, references):
    """transformers run the usual way (right padding, attention mask)."""
    ref = references["clip"]
    width = max(map(len, TEXTS))
    ids = torch.tensor([s + [1] * (width - len(s)) for s in TEXTS])
    mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in TEXTS])
    with torch.inference_mode():
        want = features(ref.get_text_features(input_ids=ids, attention_mask=mask))
    got = ClipModel.from_dir(model_dirs["clip"], get_backend("sdpa", "cpu")).embed_texts(TEXTS)
    assert_matches(got, want)


def test_siglip_text_padded_to_max_length(model_dirs, references):
    """SigLIP as it is used: ids padded to the maximum length, no mask; the
    pooled state is the last (padding) position's."""
    ref = references["siglip"]
    padded = [s + [1] * (16 - len(s)) for s in TEXTS]
    with torch.inference_mode():
        want = features(ref.get_text_features(input_ids=torch.tensor(padded)))
    got = ClipModel.from_dir(model_dirs["siglip"], get_backend("sdpa", "cpu")).embed_texts(padded)
    assert_matches(got, want)


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_a_batch_equals_each_item_alone(model_dirs, name):
    model = ClipModel.from_dir(model_dirs[name], get_backend("sdpa_padded", "cpu"))
    images = pixels(4, model.image_size, seed=3)
    batch = model.embed_images(images)
    alone = torch.cat([model.embed_images(images[i : i + 1]) for i in range(4)])
    assert (batch - alone).abs().max().item() <= 1e-5
    ragged = model.embed_texts(TEXTS)
    singles = torch.cat([model.embed_texts([s]) for s in TEXTS])
    assert (ragged - singles).abs().max().item() <= 1e-5


def test_clip_pools_the_end_of_text_token(model_dirs):
    """Tokens after the first end-of-text token leave CLIP's features
    unchanged (causal attention, first-eos pooling); before it they do not."""
    model = ClipModel.from_dir(model_dirs["clip"], get_backend("sdpa_masked", "cpu"))
    base, longer, changed = [998, 5, 6, 999], [998, 5, 6, 999, 40, 41], [998, 5, 7, 999]
    out = model.embed_texts([base, longer, changed])
    assert (out[0] - out[1]).abs().max().item() <= 1e-5
    assert (out[0] - out[2]).abs().max().item() > 1e-3


def test_attention_shapes(model_dirs):
    config = json.loads((model_dirs["clip"] / "config.json").read_text())
    text, vision = attn_shapes(config)
    assert (text.num_heads, text.head_dim, text.causal) == (4, 8, True)
    assert (vision.num_heads, vision.head_dim, vision.causal) == (4, 12, False)
    config = json.loads((model_dirs["siglip"] / "config.json").read_text())
    assert not attn_shapes(config)[0].causal


def test_refusals(model_dirs, tmp_path):
    model = ClipModel.from_dir(model_dirs["clip"], get_backend("sdpa", "cpu"))
    with pytest.raises(InvalidBatchError, match=r"\[N, 3, 32, 32\]"):
        model.embed_images(pixels(1, 48))
    with pytest.raises(InvalidBatchError, match="1 to 16 tokens"):
        model.embed_texts([list(range(17))])
    with pytest.raises(InvalidBatchError, match="token ids"):
        model.embed_texts([[998, 1000]])
    config = json.loads((model_dirs["siglip"] / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "model_type": "siglip2"}))
    with pytest.raises(ModelLoadError, match="siglip2 is not supported"):
        ClipModel.from_dir(tmp_path, get_backend("sdpa", "cpu"))
