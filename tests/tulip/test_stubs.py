"""gRPC stubs: the descriptor-set path (what a GPU machine with an older
grpcio/protobuf uses) matches the generated stubs, and a test server start
with stubs that cannot load fails at once instead of polling until its
timeout."""

from __future__ import annotations

import pytest

from tests.support import servers
from tulip import client
from tulip.client import StubError, load_stubs, stubs_from_descriptors, write_descriptors


@pytest.fixture(scope="module")
def descriptors(tmp_path_factory):
    return write_descriptors(tmp_path_factory.mktemp("protos") / "protos.desc")


def test_descriptor_stubs_encode_like_generated_ones(descriptors):
    gen_pb2, gen_grpc = load_stubs("tulip")
    pb2, grpc_mod = stubs_from_descriptors(descriptors, "tulip")
    fields = dict(token_ids=[101, 7, 102], lengths=[3], kind=pb2.OUTPUT_KIND_DENSE, normalize=False, dimensions=32)
    assert pb2.OUTPUT_KIND_DENSE == gen_pb2.OUTPUT_KIND_DENSE == 1
    ours = pb2.EmbedRequest(**fields).SerializeToString()
    assert ours == gen_pb2.EmbedRequest(**fields).SerializeToString()
    back = pb2.EmbedRequest.FromString(ours)
    assert back.HasField("normalize") and list(back.token_ids) == [101, 7, 102]
    assert hasattr(grpc_mod, "TulipStub")
    ivy_pb2, ivy_grpc = stubs_from_descriptors(descriptors, "ivy")
    assert hasattr(ivy_grpc, "IvyStub") and hasattr(ivy_pb2, "RerankRequest")


def test_descriptor_stubs_talk_to_tulip(tulip_minilm, descriptors, monkeypatch):
    monkeypatch.setenv(client.DESCRIPTORS_ENV, str(descriptors))
    with client.TulipClient(tulip_minilm.target) as c:
        assert not hasattr(c.pb2, "__file__")  # built from descriptors, not generated
        assert c.info().dimension == 384
        assert c.embed([[101, 2000, 102]]).values.shape == (1, 384)


def test_a_missing_descriptor_set_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv(client.DESCRIPTORS_ENV, str(tmp_path / "absent.desc"))
    with pytest.raises(StubError, match="absent.desc is missing"):
        load_stubs("tulip")


def test_tulip_start_fails_at_once_when_stubs_do_not_load(minilm_dir, log_dir, tmp_path, monkeypatch):
    monkeypatch.setenv(client.DESCRIPTORS_ENV, str(tmp_path / "absent.desc"))
    # A timeout would raise RuntimeError("... not serving after ..."), not this.
    with pytest.raises(StubError):
        servers.Tulip(minilm_dir, log_dir=log_dir, timeout=30)


def test_a_client_error_while_polling_is_raised_and_the_server_stopped(minilm_dir, log_dir, monkeypatch):
    started = []

    def broken_info(self):
        raise ValueError("client bug")

    real_init = servers.Process.__init__

    def record(self, *a, **kw):
        real_init(self, *a, **kw)
        started.append(self)

    monkeypatch.setattr(client.TulipClient, "info", broken_info)
    monkeypatch.setattr(servers.Process, "__init__", record)
    with pytest.raises(ValueError, match="client bug"):
        servers.Tulip(minilm_dir, log_dir=log_dir, timeout=30)
    assert len(started) == 1 and not started[0].alive()
