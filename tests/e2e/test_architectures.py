"""The newer architectures and the full sentence-transformers pipeline
served end to end: Ivy (HTTP /embed, its own tokenizer) in front of a real
Tulip on each random-weight model, against sentence-transformers on the
same weights (cosine >= 0.999)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from bench.harness import tiny_models as models
from tests.support.servers import Ivy, Tulip

pytestmark = pytest.mark.slow

TEXTS = ["What is an embedding?", "A vector that captures the meaning of a text.",
         "Der Mont Blanc ist der höchste Berg der Alpen und liegt an der Grenze zwischen Frankreich und Italien.",
         "a", "Search engines rank documents by the similarity of their vectors to the query's vector, " * 3]

BUILDERS = {
    "mpnet": lambda d: models.tiny_mpnet(d),
    "modernbert": lambda d: models.tiny_modernbert(d),
    "embeddinggemma": lambda d: models.tiny_embeddinggemma(d, sliding_window=32),
    "nomic-bert": lambda d: models.tiny_nomic_bert(d),
    "st-dense": lambda d: models.st_pipeline(d / "st", models.tiny_bert(d / "bert"), pooling="weightedmean",
                                             dense=((96, "Tanh"),)),
}


@pytest.mark.parametrize("name", list(BUILDERS))
def test_dense_through_ivy_matches_sentence_transformers(name, tmp_path, log_dir):
    from sentence_transformers import SentenceTransformer

    model_dir = BUILDERS[name](tmp_path / name)
    want = SentenceTransformer(str(model_dir), device="cpu").encode(TEXTS, convert_to_tensor=True).float()
    tulip = Tulip(str(model_dir), log_dir=log_dir, threads=1)
    try:
        ivy = Ivy([tulip.url], str(model_dir), log_dir=log_dir)
        try:
            status, body = ivy.post_json("/embed", {"inputs": TEXTS})
        finally:
            ivy.stop()
    finally:
        tulip.stop()
    assert status == 200, body
    got = torch.tensor(np.array(body, dtype=np.float32))
    assert got.shape == want.shape
    cos = torch.nn.functional.cosine_similarity(got.double(), want.double())
    assert cos.min() >= 0.999, cos
