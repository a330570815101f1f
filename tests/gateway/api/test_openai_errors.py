"""Bad requests to Ivy get a precise 4xx in OpenAI's error shape, and the
server keeps serving."""

from __future__ import annotations

import json

import pytest

from tests.support.http import raw, still_serving

GOOD = {"input": "still serving"}


def assert_error(status: int, body, want_status: int, *words: str) -> None:
    assert status == want_status, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert {"message", "type", "param", "code"} <= set(err)
    assert isinstance(err["code"], str)  # one type for every error (a label, not the status)
    for w in words:
        assert w in err["message"], err["message"]


@pytest.fixture(autouse=True)
def serving_after(ivy_minilm):
    yield
    still_serving(ivy_minilm, "/v1/embeddings", GOOD)


def test_malformed_json(ivy_minilm):
    status, body = raw(ivy_minilm, "/v1/embeddings", b'{"input": ["unterminated"')
    assert_error(status, body, 400, "not valid JSON")


@pytest.mark.parametrize("ctype", ["text/plain", None])
def test_wrong_content_type(ivy_minilm, ctype):
    status, body = raw(ivy_minilm, "/v1/embeddings", json.dumps(GOOD).encode(), ctype)
    assert_error(status, body, 415, "application/json")


@pytest.mark.parametrize(
    "payload, words",
    [
        ({}, ["missing field `input`"]),
        ({"input": None}, ["`input` is null"]),
        ({"input": []}, ["must not be empty"]),
        ({"input": ""}, ["input[0] is an empty string"]),
        ({"input": ["ok", ""]}, ["input[1] is an empty string"]),
        ({"input": ["ok", 3]}, ["input[1] must be a string"]),
        ({"input": [1, "x"]}, ["input[1] must be a non-negative integer token id"]),
        ({"input": [[1, 2], "x"]}, ["input[1] must be an array of token ids"]),
        ({"input": [-5]}, ["token id"]),
        ({"input": [[]]}, ["input[0] is empty"]),
        ({"input": [10**9]}, ["outside the vocabulary"]),
        ({"input": {"text": "x"}}, ["`input` must be a string"]),
        ({"input": True}, ["`input` must be a string"]),
        ([1, 2, 3], ["JSON object"]),
        ({"input": "x", "encoding_format": "int4"}, ["encoding_format"]),
        ({"input": "x", "dimensions": 385}, ["between 1 and the model's dimension 384"]),
        ({"input": "x", "dimensions": 0}, ["positive integer"]),
        ({"input": "x", "dimensions": -3}, ["positive integer"]),
        ({"input": "x", "dimensions": 1.5}, ["positive integer"]),
        ({"input": "x", "truncate": "yes"}, ["`truncate` must be true or false"]),
        ({"input": "x", "truncation_direction": "middle"}, ["truncation_direction"]),
    ],
)
def test_validation_errors(ivy_minilm, payload, words):
    status, body = ivy_minilm.post_json("/v1/embeddings", payload)
    assert_error(status, body, 422, *words)


def test_too_many_inputs(ivy_minilm):
    status, body = ivy_minilm.post_json("/v1/embeddings", {"input": ["x"] * 65})
    assert_error(status, body, 422, "65 inputs exceed the limit of 64")


def test_too_long_without_truncation(ivy_minilm):
    long_text = "word " * 600
    status, body = ivy_minilm.post_json("/v1/embeddings", {"input": long_text, "truncate": False})
    assert_error(status, body, 422, "accepts at most 256")
    status, body = ivy_minilm.post_json("/v1/embeddings", {"input": long_text})
    assert status == 200 and body["usage"]["prompt_tokens"] == 256


def test_body_over_limit(ivy_minilm):
    big = json.dumps({"input": "x" * (2 << 20)}).encode()
    status, body = raw(ivy_minilm, "/v1/embeddings", big)
    assert_error(status, body, 413, "larger than the limit")


def test_unknown_route_and_method(ivy_minilm):
    assert ivy_minilm.request("GET", "/v1/embeddings")[0] == 405
    assert ivy_minilm.request("POST", "/v1/nothing-here", b"{}", {"Content-Type": "application/json"})[0] == 404
