"""The reliability suite's non-timing assertions on a small scale: a bulk
job through Ivy loses nothing while replicas are killed and restarted, and
mixed traffic with bad requests gets exactly the statuses it should. The
figures (latency, memory growth, overload) come from
``python -m bench reliability``; no timing is asserted here."""

from __future__ import annotations

import pytest

from bench.reliability import chaos, soak, traffic
from tests.support.servers import Ivy, start_tulips

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def pair(minilm_dir, log_dir):
    replicas = start_tulips(2, minilm_dir, log_dir=log_dir, threads=1)
    ivy = Ivy([t.url for t in replicas], minilm_dir, log_dir=log_dir)
    yield ivy, replicas
    ivy.stop()
    for t in replicas:
        t.stop()


def test_mixed_traffic_gets_the_expected_statuses(pair, minilm_dir):
    ivy, replicas = pair
    with replicas[0].client() as c:
        vocab = c.info().vocab_size
    kinds = traffic.kinds(minilm_dir, ivy.port, None, vocab, max_inputs=2048, bad_fraction=0.2)
    result = soak.run(kinds, {"embed": ivy.port}, lambda: {"ivy": ivy.proc.pid}, seconds=12, rate=4,
                      warmup=2, window=4, rss_every=2)
    assert result["requests"] >= 40
    assert result["unexpected"] == {}
    assert any(k.startswith("bad_") for k in result["statuses"])


def test_bulk_job_loses_nothing_while_replicas_restart(pair, log_dir):
    ivy, replicas = pair
    result = chaos.run(ivy, replicas, docs=500, every=1.0, batch=50, log_dir=log_dir, threads=1)
    assert result["chaos"]["events"], "no replica was restarted during the job"
    assert result["chaos"]["chaos_error"] is None
    assert result["failed_client_requests"] == 0, result["chaos"]["failed_attempts"]
    assert result["output"]["same_shape"] and result["output"]["below_0.99999"] == 0
