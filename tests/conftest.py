"""Shared fixtures: real Tulip and Ivy processes on the default model, the
reference model, and real text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.support.servers import Ivy, Tulip, default_model_dir

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


@pytest.fixture(scope="session")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("logs")


@pytest.fixture(scope="session")
def minilm_dir() -> str:
    return default_model_dir()


@pytest.fixture(scope="session")
def tulip_minilm(minilm_dir, log_dir):
    proc = Tulip(minilm_dir, log_dir=log_dir)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def ivy_minilm(tulip_minilm, minilm_dir, log_dir):
    proc = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, max_inputs=64, max_body_bytes=1 << 20)
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def st_minilm(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(minilm_dir, device="cpu")
