"""Every error path of the TEI-compatible routes answers TEI's status code and
`{"error", "error_type"}` shape, and the server keeps serving; the OpenAPI
document describes the routes Ivy serves and the bodies it really sends."""

from __future__ import annotations

import json

import pytest

from tests.support.http import raw, still_serving

GOOD = {"inputs": "still serving"}


@pytest.fixture(autouse=True)
def serving_after(ivy_minilm):
    yield
    still_serving(ivy_minilm, "/embed", GOOD)


def assert_tei_error(status, body, want_status, error_type, *words):
    assert status == want_status, body
    assert isinstance(body, dict) and set(body) == {"error", "error_type"}, body
    assert body["error_type"] == error_type, body
    for w in words:
        assert w in body["error"], body["error"]


@pytest.mark.parametrize("path", ["/embed", "/embed_sparse", "/embed_all", "/rerank", "/tokenize"])
def test_malformed_json_and_content_type(ivy_minilm, path):
    assert_tei_error(*raw(ivy_minilm, path, b'{"inputs": ['), 400, "Validation", "not valid JSON")
    assert_tei_error(*raw(ivy_minilm, path, b"{}", "text/plain"), 415, "Validation", "application/json")
    assert_tei_error(*raw(ivy_minilm, path, b"[1]"), 422, "Validation", "JSON object")


@pytest.mark.parametrize("payload, status, error_type, words", [
    ({}, 422, "Validation", ["missing field `inputs`"]),
    ({"inputs": 3}, 422, "Validation", ["`inputs` must be a string"]),
    ({"inputs": ["a", 3]}, 422, "Validation", ["inputs[1] must be a string"]),
    ({"inputs": [[1, -2]]}, 422, "Validation", ["inputs[0][1] must be a non-negative integer token id"]),
    ({"inputs": "a", "truncate": "yes"}, 422, "Validation", ["`truncate` must be true or false"]),
    ({"inputs": "a", "normalize": 1}, 422, "Validation", ["`normalize` must be true or false"]),
    ({"inputs": "a", "truncation_direction": "up"}, 422, "Validation", ["truncation_direction"]),
    ({"inputs": "a", "dimensions": "big"}, 422, "Validation", ["positive integer"]),
    ({"inputs": "a", "prompt_name": 5}, 422, "Validation", ["`prompt_name` must be a string"]),
    ({"inputs": []}, 400, "Empty", ["must not be empty"]),
    ({"inputs": ""}, 400, "Empty", ["inputs[0] is an empty string"]),
    ({"inputs": ["x"] * 65}, 422, "Validation", ["65 inputs exceed the limit of 64"]),
    ({"inputs": "word " * 600, "truncate": False}, 422, "Validation", ["inputs[0] has 602 tokens", "accepts at most 256", "allow truncation"]),
    ({"inputs": [[101] * 300], "truncate": False}, 422, "Validation", ["inputs[0] has 300 tokens", "at most 256"]),
    ({"inputs": "a", "dimensions": 385}, 422, "Validation", ["between 1 and the model's dimension 384"]),
    ({"inputs": [[101, 10**6, 102]]}, 422, "Validation", ["inputs[0] has token id 1000000, outside the vocabulary"]),
    ({"inputs": "a", "prompt_name": "query"}, 422, "Validation", ["no prompt templates"]),
    ({"inputs": [[101, 102]], "prompt_name": "query"}, 422, "Validation", ["applies to text inputs"]),
])
def test_embed_errors(ivy_minilm, payload, status, error_type, words):
    assert_tei_error(*ivy_minilm.post_json("/embed", payload), status, error_type, *words)


def test_truncation_and_token_ids_succeed(ivy_minilm):
    text = "alpha " * 300 + "omega " * 300
    status, body = ivy_minilm.post_json("/embed", {"inputs": text, "truncate": True})
    assert status == 200 and len(body) == 1
    status, left = ivy_minilm.post_json("/embed", {"inputs": text, "truncate": True, "truncation_direction": "Left"})
    assert status == 200 and left != body
    status, body = ivy_minilm.post_json("/embed", {"inputs": [[101, 7592, 102], [101, 102]]})
    assert status == 200 and len(body) == 2


@pytest.mark.parametrize("path, payload, status, error_type, words", [
    ("/embed_sparse", {"inputs": "a"}, 424, "Backend", ["does not produce sparse"]),
    ("/rerank", {"query": "q", "texts": ["t"]}, 424, "Backend", ["does not produce score"]),
    ("/rerank", {"texts": ["t"]}, 422, "Validation", ["missing field `query`"]),
    ("/rerank", {"query": "q"}, 422, "Validation", ["missing field `texts`"]),
    ("/rerank", {"query": "q", "texts": "t"}, 422, "Validation", ["`texts` must be an array"]),
    ("/rerank", {"query": "q", "texts": []}, 400, "Empty", ["must not be empty"]),
    ("/rerank", {"query": "q", "texts": ["t"], "raw_scores": "no"}, 422, "Validation", ["raw_scores"]),
    ("/tokenize", {"inputs": []}, 400, "Empty", ["must not be empty"]),
    ("/tokenize", {"inputs": [1, 2]}, 422, "Validation", ["inputs[0] must be a string"]),
    ("/tokenize", {"inputs": ["x"] * 65}, 422, "Validation", ["65 inputs exceed the limit of 64"]),
    ("/tokenize", {"inputs": "x", "add_special_tokens": "no"}, 422, "Validation", ["add_special_tokens"]),
])
def test_other_route_errors(ivy_minilm, path, payload, status, error_type, words):
    assert_tei_error(*ivy_minilm.post_json(path, payload), status, error_type, *words)


def test_body_over_limit(ivy_minilm):
    big = json.dumps({"inputs": "x" * (2 << 20)}).encode()
    assert_tei_error(*raw(ivy_minilm, "/embed", big), 413, "Validation", "larger than the limit")


def test_tokenize_shape(ivy_minilm, st_minilm):
    status, body = ivy_minilm.post_json("/tokenize", {"inputs": ["hello world", "héllo"]})
    assert status == 200 and len(body) == 2
    first = body[0]
    assert [t["id"] for t in first] == st_minilm.tokenizer("hello world")["input_ids"]
    assert first[0] == {"id": 101, "text": "[CLS]", "special": True, "start": None, "stop": None}
    assert first[1] == {"id": 7592, "text": "hello", "special": False, "start": 0, "stop": 5}
    # Offsets are bytes into the input, as in TEI.
    assert body[1][1]["start"] == 0 and body[1][1]["text"] in "héllo"


# --- the OpenAPI document -------------------------------------------------

ROUTES = {
    "/v1/embeddings": "post", "/embed": "post", "/embed_sparse": "post", "/embed_all": "post",
    "/rerank": "post", "/tokenize": "post", "/info": "get", "/health": "get", "/ready": "get",
    "/metrics": "get", "/openapi.json": "get", "/v1/models": "get", "/v1/rerank": "post",
    "/similarity": "post", "/predict": "post", "/decode": "post",
    "/v2/embed": "post", "/quantization/ranges": "get", "/": "get", "/invocations": "post", "/ping": "get",
    "/v1/load_lora_adapter": "post", "/v1/unload_lora_adapter": "post",
    # The Batch API's (off on this Ivy: no --batch-dir): 404 saying so.
    "/v1/files": "get", "/v1/files/{file_id}": "delete", "/v1/files/{file_id}/content": "get",
    "/v1/batches": "get", "/v1/batches/{batch_id}": "get", "/v1/batches/{batch_id}/cancel": "post",
}


def validate(value, schema, doc, where="$"):
    """A small JSON Schema check (the keywords the document uses)."""
    if "$ref" in schema:
        schema = doc["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    if "oneOf" in schema:
        errors = []
        for option in schema["oneOf"]:
            try:
                validate(value, option, doc, where)
                return
            except AssertionError as e:
                errors.append(str(e))
        raise AssertionError(f"{where}: matches no option: {errors}")
    types = schema.get("type")
    if types:
        types = [types] if isinstance(types, str) else types
        kinds = {"string": str, "integer": int, "number": (int, float), "boolean": bool,
                 "array": list, "object": dict, "null": type(None)}
        ok = any(isinstance(value, kinds[t]) and not (t in ("integer", "number") and isinstance(value, bool))
                 for t in types)
        assert ok, f"{where}: {value!r} is not {types}"
    if "enum" in schema:
        assert value in schema["enum"], f"{where}: {value!r} not in {schema['enum']}"
    if isinstance(value, dict):
        for key in schema.get("required", []):
            assert key in value, f"{where}: missing {key}"
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                validate(value[key], sub, doc, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value[:3]):
            validate(item, schema["items"], doc, f"{where}[{i}]")


def response_schema(doc, path, method, status):
    return doc["paths"][path][method]["responses"][str(status)]["content"]["application/json"]["schema"]


@pytest.fixture(scope="module")
def openapi(ivy_minilm):
    status, body = ivy_minilm.get("/openapi.json")
    assert status == 200
    return json.loads(body)


def test_document_lists_exactly_the_served_routes(ivy_minilm, openapi):
    assert {p: next(iter(ops)) for p, ops in openapi["paths"].items()} == ROUTES
    for path, method in ROUTES.items():
        status, _, body = ivy_minilm.request(method.upper(), path, b"{}" if method == "post" else None,
                                             {"Content-Type": "application/json"})
        if path.startswith(("/v1/files", "/v1/batches")):
            assert status == 404 and b"--batch-dir" in body, (path, body)
        else:
            assert status not in (404, 405), path
    assert ivy_minilm.request("GET", "/not-documented")[0] == 404


@pytest.mark.parametrize("path, payload, status", [
    ("/v1/embeddings", {"input": ["a", "b"]}, 200),
    ("/v1/embeddings", {"input": "a", "encoding_format": "base64"}, 200),
    ("/v1/embeddings", {"input": []}, 422),
    ("/v1/embeddings", {"input": "a", "dimensions": 0}, 422),
    # OpenAI's string code (schemathesis found the document said integer).
    ("/v1/embeddings", {"input": "a", "model": "not-served"}, 404),
    ("/embed", {"inputs": ["a", "b"]}, 200),
    ("/embed", {"inputs": []}, 400),
    ("/embed", {"inputs": "word " * 600, "truncate": False}, 422),
    ("/embed", {"inputs": 5}, 422),
    ("/embed_sparse", {"inputs": "a"}, 424),
    ("/rerank", {"query": "q", "texts": ["t"]}, 424),
    ("/predict", {"inputs": "a"}, 424),
    ("/predict", {"inputs": [["a", "b"], "c"]}, 422),
    ("/tokenize", {"inputs": ["a", "b c"]}, 200),
    ("/decode", {"ids": [[101, 7592, 102], [101, 102]]}, 200),
    ("/decode", {"ids": "x"}, 422),
])
def test_responses_match_the_document(ivy_minilm, openapi, path, payload, status):
    got, body = ivy_minilm.post_json(path, payload)
    assert got == status, body
    validate(body, response_schema(openapi, path, "post", status), openapi)


def test_get_routes_match_the_document(ivy_minilm, openapi):
    for path in ["/info", "/ready"]:
        status, body = ivy_minilm.get(path)
        assert status == 200
        validate(json.loads(body), response_schema(openapi, path, "get", 200), openapi)
    # Request bodies the handlers accept validate against the request schemas.
    schemas = openapi["components"]["schemas"]
    validate({"inputs": ["a"], "truncate": True, "normalize": False, "dimensions": 8}, schemas["EmbedRequest"], openapi)
    validate({"query": "q", "texts": ["a"], "return_text": True}, schemas["RerankRequest"], openapi)
