"""A DNS name the test controls, as Kubernetes' headless Service would serve
it: a small authoritative DNS server (A records, TTL 0) on a loopback
address, and a private mount namespace in which /etc/resolv.conf points at
it. Only the process started inside sees the test's resolver; the machine's
own resolver is untouched and no packet leaves the loopback interface."""

from __future__ import annotations

import errno
import os
import socket
import struct
import subprocess
import threading
from pathlib import Path

# The resolver listens on a loopback address of its own (systemd-resolved
# takes 127.0.0.53), varied per process so concurrent test runs coexist.
RESOLVER_NET = "127.83"
TYPE_A = 1
CLASS_IN = 1
NOERROR, FORMERR, NXDOMAIN = 0, 1, 3


class DnsServer:
    """Answers A queries for the published names from a UDP socket on port
    53 of a free loopback address."""

    def __init__(self, port: int = 53):
        self._records: dict[str, list[str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.queries = 0
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for n in range(64):
            host = (os.getpid() + n) % 65000 + 256
            self.address = f"{RESOLVER_NET}.{host >> 8}.{host & 255 or 1}"
            try:
                self.sock.bind((self.address, port))
                break
            except OSError as e:
                if e.errno != errno.EADDRINUSE:
                    self.sock.close()
                    raise
        else:
            self.sock.close()
            raise OSError(errno.EADDRINUSE, "no free loopback address for the test resolver")
        # A short timeout lets the thread notice close(); a blocked recvfrom would not.
        self.sock.settimeout(0.2)
        self._thread = threading.Thread(target=self._serve, name="dns", daemon=True)
        self._thread.start()

    def set(self, name: str, addresses: list[str]) -> None:
        """Publishes `addresses` for `name` from the next query on."""
        with self._lock:
            self._records[name.rstrip(".").lower()] = list(addresses)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                query, peer = self.sock.recvfrom(512)
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                self.sock.sendto(self._answer(query), peer)
            except OSError:
                return

    def _answer(self, query: bytes) -> bytes:
        if len(query) < 12:
            return b""
        (txid,) = struct.unpack("!H", query[:2])
        try:
            name, end = _read_name(query, 12)
            qtype, qclass = struct.unpack("!HH", query[end:end + 4])
        except (IndexError, struct.error, UnicodeDecodeError):
            return struct.pack("!HHHHHH", txid, 0x8180 | FORMERR, 0, 0, 0, 0)
        question = query[12:end + 4]
        with self._lock:
            self.queries += 1
            addresses = self._records.get(name)
        if addresses is None:
            return struct.pack("!HHHHHH", txid, 0x8580 | NXDOMAIN, 1, 0, 0, 0) + question
        # AAAA and other types: the name exists but has no such records.
        answers = [] if (qtype, qclass) != (TYPE_A, CLASS_IN) else addresses
        # 0xc00c: a pointer to the name in the question; TTL 0: never cached.
        body = b"".join(b"\xc0\x0c" + struct.pack("!HHIH", TYPE_A, CLASS_IN, 0, 4) + socket.inet_aton(a)
                        for a in answers)
        return struct.pack("!HHHHHH", txid, 0x8580 | NOERROR, 1, len(answers), 0, 0) + question + body


def _read_name(packet: bytes, offset: int) -> tuple[str, int]:
    labels = []
    while packet[offset]:
        length = packet[offset]
        labels.append(packet[offset + 1:offset + 1 + length].decode("ascii"))
        offset += 1 + length
    return ".".join(labels).lower(), offset + 1


def namespaces_work() -> str | None:
    """None when private mount namespaces can be made here, else why not."""
    try:
        out = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"],
                             capture_output=True, text=True, timeout=10)
    except FileNotFoundError:
        return "unshare (util-linux) is not installed"
    return None if out.returncode == 0 else f"cannot create a mount namespace: {out.stderr.strip()}"


def with_resolver(cmd: list[str], workdir: Path, resolver: str) -> list[str]:
    """`cmd` run in its own mount namespace whose /etc/resolv.conf names
    `resolver` and whose /etc/hosts holds only localhost."""
    resolv = workdir / "resolv.conf"
    resolv.write_text(f"nameserver {resolver}\noptions timeout:1 attempts:3\n")
    hosts = workdir / "hosts"
    hosts.write_text("127.0.0.1 localhost\n")
    script = 'mount --bind "$1" /etc/resolv.conf && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh", str(resolv), str(hosts),
            *cmd]


def established_peers(pid: int) -> set[tuple[str, int]]:
    """(address, port) of the IPv4 TCP connections process `pid` holds open."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[len("socket:["):-1])
    peers = set()
    with open(f"/proc/{pid}/net/tcp") as f:
        for line in f.readlines()[1:]:
            fields = line.split()
            if fields[3] == "01" and fields[9] in inodes:  # 01 = ESTABLISHED
                address, port = fields[2].split(":")
                peers.add((socket.inet_ntoa(struct.pack("<I", int(address, 16))), int(port, 16)))
    return peers
