"""The official `openai` client, unchanged, against Ivy."""

from __future__ import annotations

import base64

import numpy as np
import pytest

openai = pytest.importorskip("openai")


@pytest.fixture(scope="module")
def client(ivy_minilm):
    return openai.OpenAI(base_url=f"{ivy_minilm.url}/v1", api_key="unused", max_retries=0)


@pytest.mark.parametrize("fmt", ["float", "base64"])
def test_embeddings_create(client, st_minilm, fmt):
    texts = ["The cat sat on the mat.", "Vector search finds neighbours."]
    resp = client.embeddings.create(model="all-MiniLM-L6-v2", input=texts, encoding_format=fmt)
    if fmt == "base64":
        # Asked for explicitly, the client hands back the strings as sent.
        got = np.array([np.frombuffer(base64.b64decode(d.embedding), dtype="<f4") for d in resp.data])
    else:
        got = np.array([d.embedding for d in resp.data])
    ref = st_minilm.encode(texts, normalize_embeddings=True)
    assert got.shape == (2, 384)
    cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
    assert cos.min() >= 0.999
    assert resp.usage.prompt_tokens > 0


def test_client_default_encoding(client):
    # Without encoding_format the client asks for base64 and decodes it itself.
    resp = client.embeddings.create(model="all-MiniLM-L6-v2", input=["default encoding"])
    assert len(resp.data[0].embedding) == 384


def test_embeddings_create_single_string_and_dimensions(client):
    resp = client.embeddings.create(model="all-MiniLM-L6-v2", input="one string", dimensions=128)
    assert len(resp.data) == 1 and len(resp.data[0].embedding) == 128


def test_client_sees_validation_errors(client):
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.embeddings.create(model="all-MiniLM-L6-v2", input="x", dimensions=100000)
    assert "dimensions" in str(e.value)


def test_models_list_names_the_served_model(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["sentence-transformers/all-MiniLM-L6-v2", "all-MiniLM-L6-v2"]
    resp = client.embeddings.create(model=ids[0], input="named by its full id")
    assert resp.model == ids[0]


def test_a_request_for_another_model_fails_loudly(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="text-embedding-3-small", input="misrouted")
    assert e.value.code == "model_not_found"
    assert "text-embedding-3-small" in str(e.value) and "all-MiniLM-L6-v2" in str(e.value)


def test_served_model_name_flag_replaces_the_default_names(tulip_minilm, minilm_dir, log_dir):
    from tests.support.servers import Ivy

    ivy = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, served_model_name="search-v1,search")
    try:
        c = openai.OpenAI(base_url=f"{ivy.url}/v1", api_key="unused", max_retries=0)
        assert [m.id for m in c.models.list()] == ["search-v1", "search"]
        assert c.embeddings.create(model="search", input="x").model == "search"
        with pytest.raises(openai.NotFoundError):
            c.embeddings.create(model="all-MiniLM-L6-v2", input="x")
        status, _, body = ivy.request("GET", "/info")
        assert status == 200 and b'"served_model_name":"search-v1"' in body
    finally:
        ivy.stop()
