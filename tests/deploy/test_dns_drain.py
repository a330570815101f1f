"""Ivy discovering real Tulip replicas through DNS, as it does through the
chart's headless Service, while an autoscaler resizes the pool under load:
a replica added to the DNS answer starts taking work, and one removed from
it and stopped (SIGTERM) drains, with no failed client request."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from bench.harness.fixtures import corpus_lines
from tests.deploy.resolver import DnsServer, established_peers, namespaces_work, with_resolver
from tests.support.servers import IVY_BIN, Ivy, Process, Tulip, free_port, wait_for

SERVICE = "tulip.embeddings.svc.cluster.local"
ADDRESSES = ["127.0.0.1", "127.0.0.2"]
DNS_INTERVAL = "1"
CLIENTS = 4
BATCH = 8
# Bounds on the load loop (it stops by itself well before these).
MAX_REQUESTS_PER_CLIENT = 600
LOAD_DEADLINE_S = 120.0
OK_AFTER_EXIT = 20


class TulipAt(Tulip):
    """A Tulip replica on a chosen loopback address (a pod IP, here)."""

    def __init__(self, host: str, port: int, **kw):
        super().__init__(port=port, host=host, **kw)


class DnsIvy(Ivy):
    """Ivy resolving its replicas through the test's DNS server."""

    def __init__(self, service: str, port: int, tokenizer: str, *, resolver: DnsServer, workdir: Path,
                 log_dir: Path):
        """Starts Ivy and waits until it listens (not until a replica is ready)."""
        self.port = free_port()
        cmd = [str(IVY_BIN), "--tokenizer", tokenizer, "--host", "127.0.0.1", "--port", str(self.port),
               "--health-interval", "0.2"]
        env = {"IVY_TULIP_DNS": f"{service}:{port}", "IVY_DNS_INTERVAL": DNS_INTERVAL,
               "IVY_GRPC_PORT": str(free_port())}
        Process.__init__(self, f"ivy-dns-{self.port}", with_resolver(cmd, workdir, resolver.address), env,
                         log_dir)
        self.wait_until(lambda: self.get("/health")[0] == 200, 60.0, "listening")


def shared_free_port(hosts: list[str]) -> int:
    """A port free on every one of `hosts` (each replica binds its own)."""
    for _ in range(50):
        port = free_port()
        try:
            for host in hosts:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on all replica addresses")


class Load:
    """CLIENTS threads posting /v1/embeddings until stopped; every response
    is recorded with the time it completed."""

    def __init__(self, ivy: Ivy, texts: list[str]):
        self.ivy = ivy
        self.texts = texts
        self.results: list[tuple[float, int, object]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._client, args=(i,), daemon=True) for i in range(CLIENTS)]

    def __enter__(self) -> "Load":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)

    def _client(self, index: int) -> None:
        deadline = time.monotonic() + LOAD_DEADLINE_S
        for n in range(MAX_REQUESTS_PER_CLIENT):
            if self.stop.is_set() or time.monotonic() > deadline:
                return
            start = (index * MAX_REQUESTS_PER_CLIENT + n * BATCH) % len(self.texts)
            batch = [self.texts[(start + k) % len(self.texts)] for k in range(BATCH)]
            status, body = self.ivy.post_json("/v1/embeddings", {"input": batch})
            with self.lock:
                self.results.append((time.monotonic(), status, body))

    def ok_since(self, t: float) -> int:
        with self.lock:
            return sum(1 for when, status, _ in self.results if when > t and status == 200)

    def failures(self) -> list[tuple[int, object]]:
        with self.lock:
            return [(status, body) for _, status, body in self.results if status != 200]


def replica_chunks(ivy: Ivy) -> dict[str, float]:
    """Chunks completed per replica address, from Ivy's /metrics
    (`ivy_replica_chunks_total{replica="<url>"}`, deploy/README.md)."""
    status, body = ivy.get("/metrics")
    assert status == 200
    out = {}
    for m in re.finditer(r'^ivy_replica_chunks_total\{[^}]*replica="[a-z]+://([^"/]+)/?"[^}]*\} (\S+)$',
                         body.decode(), re.M):
        out[m.group(1)] = float(m.group(2))
    return out


@pytest.fixture
def resolver():
    reason = namespaces_work()
    if reason:
        pytest.skip(reason)
    try:
        server = DnsServer()
    except PermissionError:
        pytest.skip("binding a DNS server on port 53 needs root or CAP_NET_BIND_SERVICE")
    yield server
    server.close()


@pytest.mark.slow
def test_scale_up_and_down_of_dns_discovered_replicas_under_load_fails_no_request(resolver, minilm_dir, log_dir,
                                                                                 tmp_path):
    port = shared_free_port(ADDRESSES)
    # The pool starts at one replica; the second is a pod the autoscaler adds.
    resolver.set(SERVICE, ADDRESSES[:1])
    # Ivy first, as a Deployment may start before its Tulip pods are ready.
    ivy = DnsIvy(SERVICE, port, minilm_dir, resolver=resolver, workdir=tmp_path, log_dir=log_dir)
    replicas = []
    try:
        for address in ADDRESSES:
            replicas.append(TulipAt(address, port, model_dir=minilm_dir, log_dir=log_dir, drain_timeout=30))
        ivy.wait_until(lambda: ivy.get("/ready")[0] == 200, 60.0, "ready")
        wait_for(lambda: (ADDRESSES[0], port) in established_peers(ivy.proc.pid), "Ivy to connect", 30)
        assert resolver.queries > 0

        stopping, staying = replicas
        with Load(ivy, corpus_lines()) as load:
            wait_for(lambda: load.ok_since(0) >= 20, "load to reach Ivy's replica", 60)
            assert replica_chunks(ivy).get(f"{staying.host}:{port}", 0) == 0
            # Scale-up: the new pod joins the headless Service's answer.
            resolver.set(SERVICE, ADDRESSES)
            wait_for(lambda: {(a, port) for a in ADDRESSES} <= established_peers(ivy.proc.pid),
                     "Ivy to connect to both replicas", 30)
            # Both replicas carry traffic, so the stopped one had work to drain.
            wait_for(lambda: all(replica_chunks(ivy).get(f"{a}:{port}", 0) > 0 for a in ADDRESSES),
                     "both replicas to complete chunks", 60)
            # Scale-down, what Kubernetes does when the pod is deleted: the
            # endpoint leaves the headless Service and the container gets
            # SIGTERM (here at once; the chart's preStop sleep only helps).
            resolver.set(SERVICE, [staying.host])
            stopping.signal(signal.SIGTERM)
            code = stopping.proc.wait(timeout=60)
            exited = time.monotonic()
            wait_for(lambda: load.ok_since(exited) >= OK_AFTER_EXIT, "requests served after the drain", 60)
        assert code == 0, stopping.log()[-4000:]
        assert load.failures() == []
        for _, _, body in load.results:
            assert len(body["data"]) == BATCH and len(body["data"][0]["embedding"]) == 384
        assert staying.alive()
        assert ivy.get("/ready")[0] == 200
    finally:
        ivy.stop()
        for r in replicas:
            r.stop()


def test_resolver_answers_as_a_headless_service(resolver, tmp_path):
    """The harness itself: a process in the namespace resolves the test's
    name to the published addresses, and the machine's resolver is not
    changed."""
    before = Path("/etc/resolv.conf").read_text()
    resolver.set(SERVICE, ADDRESSES)
    lookup = [sys.executable, "-c", "import json, socket, sys; print(json.dumps(sorted({a[4][0] for a in "
              "socket.getaddrinfo(sys.argv[1], 7070, socket.AF_INET, socket.SOCK_STREAM)})))", SERVICE]
    out = subprocess.run(with_resolver(lookup, tmp_path, resolver.address), capture_output=True, text=True,
                         timeout=30)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == ADDRESSES
    resolver.set(SERVICE, ADDRESSES[1:])
    out = subprocess.run(with_resolver(lookup, tmp_path, resolver.address), capture_output=True, text=True,
                         timeout=30)
    assert json.loads(out.stdout) == ADDRESSES[1:]
    getent = ["getent", "hosts", "nowhere.invalid"]
    missing = subprocess.run(with_resolver(getent, tmp_path, resolver.address), capture_output=True, text=True,
                             timeout=30)
    assert missing.returncode != 0
    assert Path("/etc/resolv.conf").read_text() == before
