"""Ivy's optional TLS (`--tls-cert`, `--tls-key`) on its HTTP and gRPC
listeners, with a self-signed certificate made here by the openssl command:
real HTTPS and gRPC-over-TLS calls succeed, plain text and untrusting
clients are refused, a silent TLS client is cut at the header timeout, and
unreadable files stop Ivy at start-up with the file named."""

from __future__ import annotations

import http.client
import shutil
import socket
import ssl
import subprocess
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest

from tests.support.servers import IVY_BIN, Ivy, free_port
from tulip.client import load_stubs

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def cert(tmp_path_factory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"],
        check=True, capture_output=True)
    return cert, key


class TlsIvy(Ivy):
    """Ivy with --tls-cert/--tls-key, reached over HTTPS with a client that
    trusts only that certificate."""

    def __init__(self, *args, cert: Path, key: Path, **flags):
        self.context = ssl.create_default_context(cafile=str(cert))
        super().__init__(*args, tls_cert=cert, tls_key=key, **flags)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def request(self, method, path, body=None, headers=None, timeout=60.0):
        req = urllib.request.Request(self.url + path, data=body, method=method, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.context) as r:
                return r.status, dict(r.headers), r.read()
        except urllib.error.HTTPError as e:
            return e.code, dict(e.headers), e.read()
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return 0, {}, b""


@pytest.fixture(scope="module")
def ivy(tulip_minilm, minilm_dir, log_dir, cert):
    proc = TlsIvy([tulip_minilm.url], minilm_dir, log_dir=log_dir, cert=cert[0], key=cert[1], header_timeout=1)
    yield proc
    proc.stop()


def test_https_request(ivy):
    status, body = ivy.post_json("/v1/embeddings", {"input": "over TLS"})
    assert status == 200
    assert len(body["data"][0]["embedding"]) == 384


def test_plain_text_and_untrusting_clients_are_refused(ivy):
    # Ivy answers plain text with a TLS alert, which is no HTTP response.
    with pytest.raises((urllib.error.URLError, ConnectionError, http.client.HTTPException)):
        urllib.request.urlopen(f"http://127.0.0.1:{ivy.port}/health", timeout=10).read()
    with pytest.raises(urllib.error.URLError) as e:
        urllib.request.urlopen(f"{ivy.url}/health", timeout=10, context=ssl.create_default_context())
    assert isinstance(e.value.reason, ssl.SSLCertVerificationError)
    assert ivy.get("/health")[0] == 200  # the trusting client still gets in


def test_grpc_over_tls(ivy, cert):
    pb2, pb2_grpc = load_stubs("ivy")
    credentials = grpc.ssl_channel_credentials(root_certificates=cert[0].read_bytes())
    with grpc.secure_channel(ivy.grpc_target, credentials,
                             options=[("grpc.ssl_target_name_override", "localhost")]) as channel:
        reply = pb2_grpc.IvyStub(channel).Embed(pb2.EmbedRequest(inputs=["over TLS"]), timeout=30)
    assert (reply.rows, reply.dim) == (1, 384)
    with grpc.insecure_channel(ivy.grpc_target) as channel:
        with pytest.raises(grpc.RpcError) as e:
            pb2_grpc.IvyStub(channel).Embed(pb2.EmbedRequest(inputs=["plain"]), timeout=10)
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE


def test_a_client_that_never_starts_the_handshake_is_cut(ivy):
    for port in (ivy.port, ivy.grpc_port):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.settimeout(30)
        try:
            assert s.recv(1024) == b""  # closed by Ivy, nothing sent
        except ConnectionResetError:
            pass
        s.close()


def test_unreadable_tls_files_stop_ivy_with_the_file_named(tmp_path, tulip_minilm, minilm_dir, cert):
    missing = tmp_path / "missing-key.pem"
    proc = subprocess.run(
        [str(IVY_BIN), "--tulip", tulip_minilm.url, "--tokenizer", minilm_dir, "--host", "127.0.0.1",
         "--port", str(free_port()), "--grpc-port", str(free_port()),
         "--tls-cert", str(cert[0]), "--tls-key", str(missing)],
        capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "missing-key.pem" in proc.stderr
