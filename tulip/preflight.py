"""Checks the launcher makes before it loads a model, which can take
minutes: a port that is taken is reported at once, naming its flag."""

from __future__ import annotations

import socket


def port_problem(host: str, ports: list[tuple[str, int]]) -> str | None:
    """Why Tulip cannot listen on one of ``ports`` ((flag, port) pairs; port
    0 is skipped: an OS-chosen port, or the metrics server off), or None.
    Binding the way the server will (SO_REUSEADDR, as tokio does) finds a
    port another process holds; the server binds again right after."""
    seen: dict[int, str] = {}
    for flag, port in ports:
        if not port:
            continue
        if port in seen:
            return f"{flag} and {seen[port]} are both {port}: give each its own port"
        seen[port] = flag
        env = "TULIP_" + flag.lstrip("-").replace("-", "_").upper()
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as e:
            return f"cannot listen on {host}:{port} ({flag}): {e}"
        family, _, _, _, addr = infos[0]
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(addr)
            except OSError as e:
                return (f"cannot listen on {host}:{port} ({flag}, env {env}): {e.strerror or e}; another "
                        f"process (a second Tulip on this host?) holds it: pass another {flag}")
    return None
