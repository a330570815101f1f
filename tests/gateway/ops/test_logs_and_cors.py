"""JSON logs from Ivy and Tulip (one object per line, the request id in
Ivy's, never a request body or the API key), and CORS on Ivy, off unless
origins are configured. Real processes."""

from __future__ import annotations

import json
import urllib.request

from tests.support.servers import Ivy, Tulip

SECRET_TEXT = "a-body-text-that-must-never-reach-a-log-line"
API_KEY = "hunter2-api-key-value"


def _json_lines(text: str) -> list[dict]:
    lines = [line for line in text.splitlines() if line.strip()]
    assert lines
    return [json.loads(line) for line in lines]  # raises on any non-JSON line


def test_json_logs_carry_request_ids_and_never_bodies_or_keys(tmp_path, log_dir, tulip_minilm):
    ivy = Ivy([tulip_minilm.url], log_dir=log_dir, json_output=True, api_key=API_KEY, log="debug")
    try:
        headers = {"Authorization": f"Bearer {API_KEY}", "x-request-id": "req-json-logs-1"}
        status, _ = ivy.post_json("/v1/embeddings", {"input": SECRET_TEXT}, headers)
        assert status == 200
        status, _ = ivy.post_json("/v1/embeddings", {"input": SECRET_TEXT}, {"x-request-id": "req-no-key"})
        assert status == 401
    finally:
        ivy.stop()
    text = ivy.log_path.read_text()
    records = _json_lines(text)
    assert SECRET_TEXT not in text and API_KEY not in text
    answered = [r for r in records if r.get("fields", {}).get("message") == "answered"]
    by_id = {r["span"]["id"]: r for r in answered}
    assert by_id["req-json-logs-1"]["fields"]["status"] == 200
    assert by_id["req-no-key"]["fields"]["status"] == 401
    assert by_id["req-no-key"]["span"]["path"] == "/v1/embeddings"


def test_tulip_json_logs(tmp_path, log_dir):
    model = tmp_path / "null"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(
        {"model_type": "null", "hidden_size": 8, "vocab_size": 100, "max_position_embeddings": 64}))
    tulip = Tulip(str(model), log_dir=log_dir, json_output="true")
    tulip.stop()
    records = _json_lines(tulip.log_path.read_text())
    messages = [r["fields"]["message"] for r in records]
    assert "tulip serving" in messages and "stopped" in messages
    assert any(r["target"] == "rose" for r in records)  # the launcher's Python logging too


def _preflight(ivy, origin: str) -> dict[str, str]:
    req = urllib.request.Request(f"{ivy.url}/v1/embeddings", method="OPTIONS", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "content-type,authorization"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return {k.lower(): v for k, v in r.headers.items()}


def test_cors_only_for_configured_origins(log_dir, tulip_minilm, ivy_minilm):
    ivy = Ivy([tulip_minilm.url], log_dir=log_dir, cors_allow_origin="https://app.example", api_key=API_KEY)
    try:
        allowed = _preflight(ivy, "https://app.example")
        assert allowed["access-control-allow-origin"] == "https://app.example"
        assert "POST" in allowed["access-control-allow-methods"]
        assert "authorization" in allowed["access-control-allow-headers"].lower()
        assert "access-control-allow-origin" not in _preflight(ivy, "https://evil.example")
        status, headers, _ = ivy.request("POST", "/v1/embeddings", json.dumps({"input": "x"}).encode(), {
            "Origin": "https://app.example", "Content-Type": "application/json",
            "Authorization": f"Bearer {API_KEY}"})
        assert status == 200
        assert {k.lower(): v for k, v in headers.items()}["access-control-allow-origin"] == "https://app.example"
    finally:
        ivy.stop()
    # Without the flag: no CORS headers at all.
    status, headers, _ = ivy_minilm.request("POST", "/v1/embeddings", json.dumps({"input": "x"}).encode(), {
        "Origin": "https://app.example", "Content-Type": "application/json"})
    assert status == 200
    assert not any(k.lower().startswith("access-control-") for k in headers)
