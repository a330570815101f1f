"""Image embeddings through the engine (``Engine.step_images``) and text
through its ordinary step, for CLIP and SigLIP on seeded random weights,
against transformers' normalised ``get_image_features`` /
``get_text_features``; the bucketed static-buffer path (CPU, no graphs);
refusals; ``ModelInfo``'s image fields; the simulated device's image step
and cost."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from bench.harness.tiny_models import tiny_dual_encoder
from rose.config import ModelSpec
from rose.engine import Engine
from rose.errors import InvalidBatchError
from rose.interface import Batch, Images
from rose.models import check_supported, config_refusal
from rose.sim import SimEngine
from rose.sim.cost import DEFAULT as ROOFLINE
from rose.sim.cost import VisionWork
from tests.support.reference import assert_close_vectors

TEXTS = [[998, 5, 17, 300, 999], [998, 42, 999], [998, 7, 7, 200, 12, 13, 14, 999], [998, 999]]


@pytest.fixture(scope="module")
def dual_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("dual-engine")
    return {"clip": tiny_dual_encoder(root / "clip", seed=0),
            "siglip": tiny_dual_encoder(root / "siglip", seed=2, family="siglip")}


@pytest.fixture(scope="module")
def engines(dual_dirs):
    return {name: Engine.from_dir(d, device="cpu") for name, d in dual_dirs.items()}


@pytest.fixture(scope="module")
def references(dual_dirs):
    from transformers import AutoModel

    return {name: AutoModel.from_pretrained(str(d), attn_implementation="eager").eval()
            for name, d in dual_dirs.items()}


def features(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.pooler_output


def pixels(n: int, size: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 3, size, size, generator=torch.Generator().manual_seed(seed))


def rows(engine, images: Images) -> torch.Tensor:
    lazy = engine.step_images(images)
    try:
        return lazy.tensor().clone()
    finally:
        lazy.release()


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_images_and_texts_match_transformers(engines, references, name):
    engine, ref = engines[name], references[name]
    size = engine.info.image_size[0]
    images = pixels(5, size)
    with torch.inference_mode():
        want_img = F.normalize(features(ref.get_image_features(pixel_values=images)), dim=-1)
        want_txt = F.normalize(torch.cat([features(ref.get_text_features(input_ids=torch.tensor([s])))
                                          for s in TEXTS]), dim=-1)
    got_img = rows(engine, Images(images))
    assert_close_vectors(got_img, want_img)
    assert torch.allclose(got_img.norm(dim=1), torch.ones(5), atol=1e-5)
    assert_close_vectors(engine.embed(TEXTS), want_txt)
    # A NumPy batch, per-image options: unnormalised rows are the raw
    # features; a Matryoshka cut leaves zeros.
    dim = engine.info.dimension
    raw = rows(engine, Images(images.numpy(), dimensions=[0, 4, 0, 0, 0], normalize=[False] * 5))
    with torch.inference_mode():
        raw_want = features(ref.get_image_features(pixel_values=images))
    assert (raw[[0, 2, 3, 4]] - raw_want[[0, 2, 3, 4]]).abs().max().item() <= 1e-4
    assert (raw[1, 4:] == 0).all() and raw.shape == (5, dim)


@pytest.mark.parametrize("name", ["clip", "siglip"])
def test_a_batch_equals_each_image_alone(engines, name):
    engine = engines[name]
    images = pixels(4, engine.info.image_size[0], seed=3)
    batch = rows(engine, Images(images))
    alone = torch.cat([rows(engine, Images(images[i:i + 1])) for i in range(4)])
    assert (batch - alone).abs().max().item() <= 1e-5


def test_static_buffers_on_the_cpu_pad_to_a_power_of_two(dual_dirs, engines):
    """The graph path's bookkeeping without a GPU: 3 images on a 4-slot
    configuration (warm-up, capture, replay), rows as the eager step's."""
    engine = Engine.from_dir(dual_dirs["clip"], device="cpu", static_on_cpu=True)
    images = pixels(3, engine.info.image_size[0], seed=4)
    eager = rows(engines["clip"], Images(images))
    modes = []
    for _ in range(3):
        lazy = engine.step_images(Images(images))
        modes.append(lazy.info.mode)
        assert lazy.info.padded_tokens == 4 * engine.info.image_tokens
        assert (lazy.tensor() - eager).abs().max().item() <= 1e-5
        lazy.release()
    assert modes == ["image_warmup", "image_capture", "image_replay"]
    assert set(modes) <= set(engine.info.step_modes)
    # Text steps padded to their bucket (filler positions past CLIP's table).
    for _ in range(3):
        assert (engine.embed(TEXTS) - engines["clip"].embed(TEXTS)).abs().max().item() <= 1e-5
    # Past the largest bucket: eager.
    lazy = engine.step_images(Images(pixels(65, engine.info.image_size[0])))
    assert lazy.info.mode == "image_eager" and lazy.rows == 65


def test_model_info(engines, bert_dir):
    clip, siglip = engines["clip"].info, engines["siglip"].info
    # CLIP: (32 / 8)^2 patches and the class token; SigLIP: (48 / 16)^2.
    assert (clip.image_size, clip.image_tokens, clip.takes_images) == ((32, 32), 17, True)
    assert (siglip.image_size, siglip.image_tokens) == ((48, 48), 9)
    assert clip.image_step_modes and set(clip.image_step_modes) <= set(clip.step_modes)
    assert (clip.dimension, clip.normalize_default, clip.span_pooling) == (24, True, "")
    text = Engine.from_dir(bert_dir, device="cpu").info
    assert (text.image_size, text.image_tokens, text.image_step_modes, text.takes_images) == ((0, 0), 0, (), False)
    assert not any(m.startswith("image_") for m in text.step_modes)


def test_bad_input_is_refused(engines, bert_dir):
    engine = engines["clip"]
    good = pixels(2, 32)
    bad = {
        "wrong size": Images(pixels(2, 16)),
        "wrong channels": Images(torch.randn(2, 1, 32, 32)),
        "no image": Images(torch.zeros(0, 3, 32, 32)),
        "not a batch": Images(torch.zeros(3, 32, 32)),
        "float64": Images(good.double()),
        "a NaN": Images(good.clone().index_put_((torch.tensor([1]),), torch.tensor(float("nan")))),
        "an infinity": Images(np.full((1, 3, 32, 32), np.inf, dtype=np.float32)),
        "options of another length": Images(good, dimensions=[0]),
        "dimensions too large": Images(good, dimensions=[0, 25]),
        "not Images": good,
    }
    for why, images in bad.items():
        with pytest.raises(InvalidBatchError):
            engine.step_images(images)  # type: ignore[arg-type]
            pytest.fail(f"{why} was accepted")
    with pytest.raises(InvalidBatchError, match="takes no images"):
        Engine.from_dir(bert_dir, device="cpu").step_images(Images(good))
    # The engine still serves both after refusals.
    assert rows(engine, Images(good)).shape == (2, 24)
    assert engine.embed(TEXTS).shape == (len(TEXTS), 24)


def test_servers_take_clip_and_siglip_and_describe_their_inputs(dual_dirs, engines):
    """Servers start CLIP and SigLIP (the Hub download and Tulip's launcher
    check with ``config_refusal``/``check_supported``); the info says how a
    host prepares images and pads SigLIP's text."""
    for d in dual_dirs.values():
        config = json.loads((d / "config.json").read_text())
        assert config_refusal(config) is None
        check_supported(ModelSpec.from_dir(d))
    assert (engines["clip"].info.text_pad_to, engines["clip"].info.pad_token_id) == (0, 0)
    assert (engines["siglip"].info.text_pad_to, engines["siglip"].info.pad_token_id) == (16, 1)
    assert config_refusal({"model_type": "siglip2"}) is not None


def test_simulated_image_steps(dual_dirs):
    engine = SimEngine.from_dir(dual_dirs["siglip"])
    assert engine.info.image_tokens == 9 and "image_warmup" in engine.info.step_modes
    images = pixels(3, 48).numpy()
    lazy = engine.step_images(Images(images, dimensions=[0, 8, 0]))
    out = lazy.tensor().clone()
    lazy.release()
    assert out.shape == (3, engine.info.dimension) and lazy.info.padded_tokens == 4 * 9
    assert (out[1, 8:] == 0).all() and torch.allclose(out.norm(dim=1), torch.ones(3), atol=1e-5)
    # Deterministic per image: batched = alone.
    alone = engine.step_images(Images(images[2:3]))
    assert torch.equal(alone.tensor()[0], out[2])
    alone.release()
    with pytest.raises(InvalidBatchError):
        engine.step_images(Images(images[:, :, :16]))
    # The text step still runs, on the text cost.
    assert engine.embed(TEXTS).shape == (len(TEXTS), engine.info.dimension)


def test_image_cost_grows_with_images_and_tower_size():
    base = VisionWork.of(dict(image_size=224, patch_size=16, num_hidden_layers=12, hidden_size=768,
                              intermediate_size=3072), class_token=True)
    large = VisionWork.of(dict(image_size=224, patch_size=14, num_hidden_layers=24, hidden_size=1024,
                               intermediate_size=4096), class_token=True)
    assert base.tokens == 197 and large.tokens == 257
    times = [ROOFLINE.image_seconds(n, base) for n in (1, 8, 64)]
    assert times[0] > ROOFLINE.t0 and times[0] < times[1] < times[2]
    assert ROOFLINE.image_seconds(8, large) > 3 * (times[1] - ROOFLINE.t0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_image_graph_replay_equals_eager_on_cuda(dual_dirs):
    graphs = Engine.from_dir(dual_dirs["clip"], device="cuda", dtype="float32", attention="sdpa")
    eager = Engine.from_dir(dual_dirs["clip"], device="cuda", dtype="float32", attention="sdpa", graphs=False)
    images = pixels(3, 32, seed=5)
    want = rows(eager, Images(images))
    modes = []
    for _ in range(4):
        lazy = graphs.step_images(Images(images))
        modes.append(lazy.info.mode)
        assert (lazy.tensor() - want).abs().max().item() <= 1e-4
        lazy.release()
    assert modes == ["image_warmup", "image_capture", "image_replay", "image_replay"]
    assert rows(eager, Images(images)).shape == (3, 24)
    # Text steps on the same engine, graphs included.
    text = Batch.from_lists(TEXTS)
    assert graphs.step(text).tensor().shape == (len(TEXTS), 24)
