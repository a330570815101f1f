"""text-embeddings-inference 1.9 parity on the TEI routes: `--auto-truncate`
(default true) decides `truncate` when a request does not, broken rules are
422 `Validation`, `/info` carries every field TEI 1.9 sends, `/decode` turns
ids back into the text Hugging Face `tokenizers` gives; and the streaming
gRPC call `ivy.v1.Ivy/EmbedStream` answers each message in order, with
per-message errors that leave the stream open."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from tests.support.http import get_json
from tests.support.reference import hf_tokenizer
from tests.support.servers import Ivy
from tulip.client import load_stubs

LONG = "word " * 600  # far past MiniLM's 256 tokens

# Every key TEI 1.9's /info sends (router/src/lib.rs, `Info`).
TEI_INFO_KEYS = {
    "model_id", "model_sha", "model_dtype", "served_model_name", "model_type", "max_concurrent_requests",
    "max_input_length", "max_batch_tokens", "max_batch_requests", "max_client_batch_size", "auto_truncate",
    "tokenization_workers", "version", "sha", "docker_label",
}


@pytest.fixture(scope="module")
def ivy_strict(tulip_minilm, minilm_dir, log_dir):
    """Ivy with truncation off unless a request asks (`--auto-truncate false`)."""
    proc = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, auto_truncate="false", stream_window=2)
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def minilm_tokenizer(minilm_dir):
    return hf_tokenizer(minilm_dir)


# --- --auto-truncate -------------------------------------------------------

@pytest.mark.parametrize("path, payload", [
    ("/embed", {"inputs": LONG}),
    ("/similarity", {"inputs": {"source_sentence": LONG, "sentences": ["a", LONG]}}),
])
def test_auto_truncate_is_the_default(ivy_minilm, ivy_strict, path, payload):
    status, body = ivy_minilm.post_json(path, payload)
    assert status == 200, body
    status, explicit = ivy_minilm.post_json(path, {**payload, "truncate": True})
    assert status == 200 and np.allclose(body, explicit, atol=1e-6)
    # Refused where the server says so, unless the request asks.
    status, body = ivy_strict.post_json(path, payload)
    assert status == 422 and body["error_type"] == "Validation" and "allow truncation" in body["error"], body
    status, asked = ivy_strict.post_json(path, {**payload, "truncate": True})
    assert status == 200 and np.allclose(asked, explicit, atol=1e-6)
    # And a request that says false is refused on the default server too.
    status, body = ivy_minilm.post_json(path, {**payload, "truncate": False})
    assert status == 422 and body["error_type"] == "Validation", body


def test_auto_truncate_from_the_environment(tulip_minilm, minilm_dir, log_dir):
    ivy = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, env={"IVY_AUTO_TRUNCATE": "false"})
    try:
        assert get_json(ivy, "/info")[1]["auto_truncate"] is False
        assert ivy.post_json("/embed", {"inputs": LONG})[0] == 422
    finally:
        ivy.stop()


def test_openapi_default_follows_the_flag(ivy_minilm, ivy_strict):
    for ivy, want in [(ivy_minilm, True), (ivy_strict, False)]:
        doc = get_json(ivy, "/openapi.json")[1]
        assert doc["components"]["schemas"]["EmbedRequest"]["properties"]["truncate"]["default"] is want


# --- /embed_all: per-token states for any model ----------------------------

def test_embed_all_is_the_last_hidden_state(ivy_minilm, st_minilm, stubs):
    """MiniLM has no multi-vector head: /embed_all answers TEI's per-token
    hidden states, every token (special ones included), not normalised,
    equal to transformers' last_hidden_state; gRPC EmbedAll the same."""
    import torch

    texts = ["The cat sat on the mat.", "héllo wörld, a longer second sentence here"]
    status, body = ivy_minilm.post_json("/embed_all", {"inputs": texts})
    assert status == 200 and len(body) == 2, body
    bert = st_minilm[0].auto_model.eval()
    tok = st_minilm.tokenizer
    for text, got in zip(texts, body):
        enc = tok(text, return_tensors="pt")
        with torch.inference_mode():
            want = bert(**enc).last_hidden_state[0].numpy()
        got = np.asarray(got, dtype=np.float32)
        assert got.shape == want.shape == (enc["input_ids"].shape[1], 384)
        assert np.allclose(got, want, atol=1e-3), np.abs(got - want).max()
    pb2, pb2_grpc = stubs
    with grpc.insecure_channel(ivy_minilm.grpc_target) as channel:
        reply = pb2_grpc.IvyStub(channel).EmbedAll(pb2.EmbedRequest(inputs=texts), timeout=60)
    rows = np.frombuffer(reply.data, dtype="<f4").reshape(-1, reply.dim)
    assert list(reply.row_counts) == [len(b) for b in body] and reply.dim == 384
    assert np.allclose(rows, np.concatenate([np.asarray(b, np.float32) for b in body]), atol=1e-6)


def test_embed_all_truncates_by_default(ivy_minilm, ivy_strict):
    status, body = ivy_minilm.post_json("/embed_all", {"inputs": LONG})
    assert status == 200 and len(body[0]) == 256
    status, body = ivy_strict.post_json("/embed_all", {"inputs": LONG})
    assert status == 422 and body["error_type"] == "Validation"


# --- /info -------------------------------------------------------------------

def test_info_has_every_tei_19_field(ivy_minilm, ivy_strict):
    status, info = get_json(ivy_minilm, "/info")
    assert status == 200 and TEI_INFO_KEYS <= set(info), TEI_INFO_KEYS - set(info)
    assert info["auto_truncate"] is True and get_json(ivy_strict, "/info")[1]["auto_truncate"] is False
    assert info["max_client_batch_size"] == 64  # the fixture's --max-inputs
    assert info["served_model_name"] == info["model_id"]
    assert isinstance(info["tokenization_workers"], int) and info["tokenization_workers"] >= 1
    assert isinstance(info["model_dtype"], str) and info["max_input_length"] == 256
    assert info["model_type"] == {"embedding": {"pooling": "mean"}}


# --- /decode -----------------------------------------------------------------

@pytest.mark.parametrize("text", ["Hello, World! It's a test.", "héllo wörld don't stop", "a  b\tc"])
def test_decode_matches_tokenizers(ivy_minilm, minilm_tokenizer, text):
    ids = minilm_tokenizer.encode(text).ids
    for skip in [True, False]:
        status, body = ivy_minilm.post_json("/decode", {"ids": ids, "skip_special_tokens": skip})
        assert status == 200 and body == [minilm_tokenizer.decode(ids, skip_special_tokens=skip)], body
    # The default skips special tokens; a batch answers in order.
    status, body = ivy_minilm.post_json("/decode", {"ids": [ids, ids[1:-1], [101, 10**6, 102]]})
    want = [minilm_tokenizer.decode(i) for i in (ids, ids[1:-1], [101, 10**6, 102])]
    assert status == 200 and body == want and body[2] == ""


def test_decode_round_trips_tokenize(ivy_minilm):
    tokens = ivy_minilm.post_json("/tokenize", {"inputs": "hello world"})[1][0]
    status, body = ivy_minilm.post_json("/decode", {"ids": [t["id"] for t in tokens]})
    assert status == 200 and body == ["hello world"]


@pytest.mark.parametrize("payload, status, error_type, words", [
    ({}, 422, "Validation", "missing field `ids`"),
    ({"ids": "hello"}, 422, "Validation", "`ids` must be an array"),
    ({"ids": [1, -2]}, 422, "Validation", "ids[1] must be a non-negative integer"),
    ({"ids": [[1], "x"]}, 422, "Validation", "ids[1]"),
    ({"ids": [1], "skip_special_tokens": "no"}, 422, "Validation", "skip_special_tokens"),
    ({"ids": [[1]] * 65}, 422, "Validation", "65 sequences exceed the limit of 64"),
])
def test_decode_errors(ivy_minilm, payload, status, error_type, words):
    got, body = ivy_minilm.post_json("/decode", payload)
    assert got == status and body["error_type"] == error_type and words in body["error"], body


def test_decode_empty_sequence(ivy_minilm):
    # TEI reads `[]` as one empty sequence.
    assert ivy_minilm.post_json("/decode", {"ids": []}) == (200, [""])


# --- gRPC EmbedStream --------------------------------------------------------

@pytest.fixture(scope="module")
def stubs():
    return load_stubs("ivy")


def vectors(pb2, response):
    assert response.WhichOneof("result") == "embedding", response
    e = response.embedding
    return np.frombuffer(e.data, dtype="<f4").reshape(e.rows, e.dim)


@pytest.mark.parametrize("server", ["ivy_minilm", "ivy_strict"])
def test_embed_stream_answers_each_message_in_order(request, stubs, st_minilm, server):
    """Many messages pipelined over one stream (`ivy_strict` runs with a
    window of 2, so most wait to be read): one answer per message, in
    order, each the same as the unary call's."""
    ivy = request.getfixturevalue(server)
    pb2, pb2_grpc = stubs
    texts = [[f"message {i}: the cat sat on mat number {i}"] * (1 + i % 3) for i in range(40)]
    with grpc.insecure_channel(ivy.grpc_target) as channel:
        stub = pb2_grpc.IvyStub(channel)
        answers = list(stub.EmbedStream(iter(pb2.EmbedRequest(inputs=t) for t in texts), timeout=120))
    assert len(answers) == len(texts)
    for t, a in zip(texts, answers):
        got = vectors(pb2, a)
        ref = st_minilm.encode(t, normalize_embeddings=True)
        assert got.shape == (len(t), 384) and np.allclose(got, ref, atol=1e-4)


def test_embed_stream_errors_do_not_end_it(ivy_minilm, stubs):
    pb2, pb2_grpc = stubs
    requests = [
        pb2.EmbedRequest(inputs=["first"]),
        pb2.EmbedRequest(inputs=[]),
        pb2.EmbedRequest(inputs=["x", ""]),
        pb2.EmbedRequest(inputs=["x"], dimensions=999),
        pb2.EmbedRequest(inputs=[LONG]),  # gRPC truncates only when asked, as TEI's
        pb2.EmbedRequest(inputs=[LONG], truncate=True),
        pb2.EmbedRequest(inputs=["last"], dimensions=32),
    ]
    with grpc.insecure_channel(ivy_minilm.grpc_target) as channel:
        stub = pb2_grpc.IvyStub(channel)
        call = stub.EmbedStream(iter(requests), metadata=[("x-request-id", "stream-1")], timeout=60)
        answers = list(call)
        assert call.code() == grpc.StatusCode.OK
        assert dict(call.initial_metadata())["x-request-id"] == "stream-1"
    assert [a.WhichOneof("result") for a in answers] == \
        ["embedding", "error", "error", "error", "error", "embedding", "embedding"]
    invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
    errors = [a.error for a in answers if a.WhichOneof("result") == "error"]
    assert [e.code for e in errors] == [invalid] * 4
    for e, words in zip(errors, ["must not be empty", "inputs[1] is an empty string", "dimensions", "at most 256"]):
        assert words in e.message, e.message
    assert vectors(pb2, answers[0]).shape == (1, 384) and vectors(pb2, answers[6]).shape == (1, 32)
    # Per-message metrics: 3 answered, 4 refused.
    assert ivy_minilm.series("ivy_requests_total", api="grpc", endpoint="embed_stream", status="InvalidArgument",
                             error="validation") >= 2


def test_embed_stream_empty_and_interleaved(ivy_minilm, stubs):
    """A stream with no messages ends at once with OK; a client that waits
    for each answer before sending the next (one message in flight) gets
    each answer as soon as it is ready, not at the end of the stream."""
    pb2, pb2_grpc = stubs
    import queue

    with grpc.insecure_channel(ivy_minilm.grpc_target) as channel:
        stub = pb2_grpc.IvyStub(channel)
        assert list(stub.EmbedStream(iter([]), timeout=30)) == []
        outbox: queue.Queue = queue.Queue()

        def requests():
            while (r := outbox.get()) is not None:
                yield r

        answers = stub.EmbedStream(requests(), timeout=60)
        got = []
        for i in range(5):
            outbox.put(pb2.EmbedRequest(inputs=[f"ping {i}"] * (i + 1)))
            got.append(vectors(pb2, next(answers)).shape[0])  # would hang if answers waited for the end
        outbox.put(None)
        assert list(answers) == [] and got == [1, 2, 3, 4, 5]


def test_embed_stream_api_key(tulip_minilm, minilm_dir, log_dir, stubs):
    pb2, pb2_grpc = stubs
    ivy = Ivy([tulip_minilm.url], minilm_dir, log_dir=log_dir, api_key="sekret")
    try:
        with grpc.insecure_channel(ivy.grpc_target) as channel:
            stub = pb2_grpc.IvyStub(channel)
            with pytest.raises(grpc.RpcError) as e:
                list(stub.EmbedStream(iter([pb2.EmbedRequest(inputs=["x"])]), timeout=30))
            assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
            ok = list(stub.EmbedStream(iter([pb2.EmbedRequest(inputs=["x"])]),
                                       metadata=[("authorization", "Bearer sekret")], timeout=30))
            assert vectors(pb2, ok[0]).shape == (1, 384)
    finally:
        ivy.stop()
