"""A newcomer's mistakes in front of Ivy (issue 32), with real Ivy and
Tulip processes: a 503 says which replica was refused and why, a --tulip
without a scheme works, a taken gRPC port names its flag, unknown routes
and methods answer JSON in their family's shape, and booleans read the
same as Tulip's."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess

import pytest

from bench.harness import tiny_models as models
from tests.support.servers import IVY_BIN, Ivy, Tulip, default_model_dir, free_port, wait_for

pytestmark = pytest.mark.slow


def unavailable_message(ivy: Ivy) -> str:
    status, body = ivy.post_json("/v1/embeddings", {"input": "hello"})
    assert status == 503, body
    return body["error"]["message"]


def test_a_replica_without_tokenizer_json_is_refused_with_the_reason(tmp_path, log_dir):
    """Item 2: the 503 names the replica, says why it is refused and what to
    do, where before it said only "retry shortly"."""
    model = tmp_path / "no-tokenizer"
    shutil.copytree(default_model_dir(), model, ignore=shutil.ignore_patterns("tokenizer.json"))
    tulip = Tulip(str(model), log_dir=log_dir)
    ivy = Ivy([tulip.url], tokenizer=False, log_dir=log_dir, wait_ready=False)
    try:
        wait_for(lambda: "refused" in ivy.log(), "Ivy to refuse the replica", timeout=30)
        message = unavailable_message(ivy)
        assert tulip.url in message and "is refused" in message, message
        assert "no tokenizer.json" in message and "--tokenizer" in message, message
    finally:
        ivy.stop()
        tulip.stop()


def test_a_replica_restarted_with_another_model_is_named_in_the_503(tmp_path, log_dir):
    """Item 2: the one replica comes back serving another model. It joins
    that model's pool (several models behind one Ivy, issue 29), so the
    first model's 503 says where the replica went and how to use it, and
    requests naming the new model are served."""
    tulip = Tulip(log_dir=log_dir)
    port = tulip.port
    ivy = Ivy([tulip.url], tokenizer=False, log_dir=log_dir)
    other = None
    try:
        tulip.stop()
        other = Tulip(str(models.tiny_bert(tmp_path / "tiny")), port=port, log_dir=log_dir)
        wait_for(lambda: ivy.series("ivy_replica_up", model="tiny") == 1, "Ivy to open the new model's pool",
                 timeout=30)
        message = unavailable_message(ivy)
        assert "model `sentence-transformers/all-MiniLM-L6-v2`" in message, message
        assert f"http://127.0.0.1:{port} serves model `tiny` now (name it in `model` to use it)" in message, message
        status, body = ivy.post_json("/v1/embeddings", {"input": "hello", "model": "tiny"})
        assert status == 200 and body["model"] == "tiny", body
    finally:
        ivy.stop()
        if other is not None:
            other.stop()


def test_a_down_replica_is_named_with_what_to_check(log_dir):
    port = free_port()
    ivy = Ivy([f"http://127.0.0.1:{port}"], log_dir=log_dir, wait_ready=False)
    try:
        wait_for(lambda: "is down" in unavailable_message(ivy), "the replica to be marked down", timeout=30)
        message = unavailable_message(ivy)
        assert f"http://127.0.0.1:{port} is down" in message and "--tulip names its gRPC port" in message
    finally:
        ivy.stop()


def test_a_tulip_address_without_scheme_is_http(tulip_minilm, log_dir):
    """Item 3: ``--tulip 127.0.0.1:7070`` works; a scheme Ivy cannot use is
    refused at start with the expected form."""
    ivy = Ivy([tulip_minilm.target], log_dir=log_dir)
    try:
        status, body = ivy.post_json("/v1/embeddings", {"input": "hello"})
        assert status == 200, body
    finally:
        ivy.stop()
    r = subprocess.run([str(IVY_BIN), "--tulip", "grpc://127.0.0.1:7070", "--port", str(free_port())],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode != 0 and "http://HOST:PORT" in r.stderr, r.stderr


def test_a_taken_grpc_port_is_named(tulip_minilm):
    """Item 4."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = subprocess.run([str(IVY_BIN), "--tulip", tulip_minilm.url, "--host", "127.0.0.1", "--port",
                            str(free_port()), "--grpc-port", str(port), "--tokenizer", default_model_dir()],
                           capture_output=True, text=True, timeout=30)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and f"127.0.0.1:{port} (--grpc-port)" in out, out


@pytest.mark.parametrize("method,path,status,allow", [
    ("GET", "/v1/nope", 404, None), ("GET", "/nope", 404, None),
    ("GET", "/v1/embeddings", 405, "POST"), ("GET", "/embed", 405, "POST"), ("POST", "/info", 405, "GET"),
])
def test_unknown_routes_and_methods_answer_json_in_their_familys_shape(ivy_minilm, method, path, status, allow):
    """Item 8: OpenAI's shape under /v1/, TEI's elsewhere."""
    got, headers, body = ivy_minilm.request(method, path, b"{}" if method == "POST" else None,
                                            {"Content-Type": "application/json"})
    assert got == status, body
    data = json.loads(body)
    if path.startswith("/v1/"):
        assert set(data["error"]) >= {"message", "type", "code"} and isinstance(data["error"]["code"], str), data
        message = data["error"]["message"]
    else:
        assert set(data) == {"error", "error_type"}, data
        message = data["error"]
    assert path in message, message
    if allow:
        assert allow in headers.get("Allow", headers.get("allow", "")).split(","), headers


def test_null_input_says_null(ivy_minilm):
    """Item 8: ``"input": null`` is not a missing field."""
    status, body = ivy_minilm.post_json("/v1/embeddings", {"input": None})
    assert status == 422 and "`input` is null" in body["error"]["message"], body
    status, body = ivy_minilm.post_json("/v1/embeddings", {})
    assert status == 422 and "missing field `input`" in body["error"]["message"], body


def test_openai_error_codes_are_strings(ivy_minilm):
    """Item 8: ``error.code`` has one type, whatever the error."""
    codes = []
    for payload in ({"input": None}, {"input": "x", "model": "no-such-model"}, {"input": []}):
        _, body = ivy_minilm.post_json("/v1/embeddings", payload)
        codes.append(body["error"]["code"])
    _, _, body = ivy_minilm.request("POST", "/v1/embeddings", b"{", {"Content-Type": "application/json"})
    codes.append(json.loads(body)["error"]["code"])
    assert all(isinstance(c, str) for c in codes), codes
    assert "model_not_found" in codes


def test_too_large_names_the_flag(ivy_minilm):
    """Item 8: the 413 says which flag raises the limit."""
    big = json.dumps({"input": "x" * (2 << 20)}).encode()
    status, _, body = ivy_minilm.request("POST", "/v1/embeddings", big, {"Content-Type": "application/json"})
    assert status == 413 and "--max-body-bytes" in json.loads(body)["error"]["message"], body


def test_booleans_read_like_tulips(tulip_minilm, log_dir):
    """Item 10: Ivy's booleans take the values Tulip's take, and a bare
    --json-output still works."""
    ivy = Ivy([tulip_minilm.url], log_dir=log_dir, json_output="yes", coalesce="off", auto_truncate="1")
    try:
        status, body = ivy.post_json("/v1/embeddings", {"input": "hello"})
        assert status == 200, body
        first = next(line for line in ivy.log().splitlines() if line.startswith("{"))
        json.loads(first)
    finally:
        ivy.stop()
    r = subprocess.run([str(IVY_BIN), "--tulip", tulip_minilm.url, "--coalesce", "maybe"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2 and "maybe" in r.stderr, r.stderr


def test_help_shows_real_defaults():
    """Item 10: flags whose stored default is 0 for "decided at start" say
    what it becomes."""
    text = subprocess.run([str(IVY_BIN), "--help"], capture_output=True, text=True, timeout=30).stdout
    assert "[default: the model's maximum]" in text and "[default: half the cores, at least one]" in text
    for flag in ("--max-input-length", "--io-threads"):
        block = text.split(f"{flag} <")[1].split("\n\n  ")[0]
        assert "[default: 0]" not in block, block
