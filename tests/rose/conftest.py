"""Tiny random-weight model directories (built once per session) and real
token ids for the ROSE tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.harness.fixtures import corpus_lines
from bench.harness.tiny_models import tiny_bert, tiny_qwen3, tiny_qwen3_reranker, tiny_reranker, tiny_xlmr


@pytest.fixture(scope="session")
def models_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("models")


@pytest.fixture(scope="session")
def bert_dir(models_root):
    return tiny_bert(models_root / "bert", pooling="mean")


@pytest.fixture(scope="session")
def bert_cls_dir(models_root):
    return tiny_bert(models_root / "bert-cls", seed=1, pooling="cls")


@pytest.fixture(scope="session")
def xlmr_dir(models_root):
    return tiny_xlmr(models_root / "xlmr")


@pytest.fixture(scope="session")
def e5_dir(models_root):
    """multilingual-e5 style: XLM-R, mean pooling, no extra heads."""
    return tiny_xlmr(models_root / "e5", seed=3, pooling="mean", m3_heads=False)


@pytest.fixture(scope="session")
def reranker_xlmr_dir(models_root):
    return tiny_reranker(models_root / "rerank-xlmr", arch="xlm-roberta")


@pytest.fixture(scope="session")
def reranker_bert_dir(models_root):
    return tiny_reranker(models_root / "rerank-bert", seed=4, arch="bert")


@pytest.fixture(scope="session")
def modernbert_reranker_dir(models_root):
    """gte-reranker-modernbert style: ModernBertForSequenceClassification, one label."""
    from bench.harness.tiny_models import tiny_modernbert

    return tiny_modernbert(models_root / "modernbert-reranker", seed=14, labels=("score",))


@pytest.fixture(scope="session")
def qwen3_reranker_dir(models_root):
    """Qwen3-Reranker style: a causal LM scored by its yes/no logits."""
    return tiny_qwen3_reranker(models_root / "qwen3-reranker", seed=9)


@pytest.fixture(scope="session")
def qwen3_dir(models_root):
    return tiny_qwen3(models_root / "qwen3", variant="causal")


@pytest.fixture(scope="session")
def pplx_dir(models_root):
    return tiny_qwen3(models_root / "pplx", seed=5, variant="pplx")


@pytest.fixture(scope="session")
def bidir_dir(pplx_dir, models_root):
    """Bidirectional Qwen3 with mean pooling but no int8 mapping, for
    checks at float tolerance (rounding would turn 1e-6 into 1)."""
    import shutil

    out = models_root / "qwen3-bidir"
    shutil.copytree(pplx_dir, out)
    cfg = json.loads((out / "config.json").read_text())
    del cfg["embedding_quantization"]
    (out / "config.json").write_text(json.dumps(cfg))
    return out


@pytest.fixture(scope="session")
def texts() -> list[str]:
    """Real multilingual passages and sentences of varied length."""
    lines = corpus_lines("calibration_miracl.txt")
    return [lines[i][: 40 + 37 * (i % 9)] for i in range(0, 360, 23)] + ["a", "Hello World!"]


def tokenize(model_dir: Path, texts: list[str], max_length: int = 256) -> list[list[int]]:
    """Token ids with the model directory's own tokenizer (special tokens
    added as its post-processor says), truncated to ``max_length``."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    tok.enable_truncation(max_length)
    return [e.ids for e in tok.encode_batch(texts)]
