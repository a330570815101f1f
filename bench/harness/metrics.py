"""Tulip's Prometheus metrics, read before and after a timed block to split
a request's time into stages on the server's own clock."""

from __future__ import annotations

import re

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")

# Histograms whose mean per request (or per step) is a stage of the path.
STAGES = {
    "tulip_request_duration_seconds": "Tulip: request arrival → response (server side)",
    "tulip_queue_duration_seconds": "Tulip: waiting to be batched",
    "tulip_inference_duration_seconds": "Tulip: first launch → last row on the host",
    "tulip_step_duration_seconds": "ROSE step: launch → rows on the host",
}


def parse(text: str) -> dict[str, float]:
    """``{"name{labels}": value}`` for every sample line."""
    out = {}
    for line in text.splitlines():
        m = _LINE.match(line.strip())
        if m:
            try:
                out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
            except ValueError:
                pass
    return out


def steps(parsed: dict[str, float], mode: str) -> float:
    """Steps Tulip ran in a mode (``tulip_steps_total{mode=...}``; the CPU
    fast path's are ``onnx``)."""
    return sum(v for k, v in parsed.items() if k.startswith("tulip_steps_total") and f'mode="{mode}"' in k)


def stage_means(before: dict[str, float], after: dict[str, float]) -> dict[str, dict]:
    """Per stage histogram: how many observations fell between the two
    scrapes and their mean in milliseconds."""
    out = {}
    for name, what in STAGES.items():
        n = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        s = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        out[name] = {"what": what, "count": int(n), "mean_ms": round(s / n * 1e3, 4) if n else None}
    return out


# Histograms of batch shape: their mean is per engine step.
BATCH_SHAPE = {
    "tulip_batch_tokens": "real tokens per engine step",
    "tulip_batch_sequences": "sequences per engine step",
}


def batch_means(before: dict[str, float], after: dict[str, float]) -> dict[str, dict]:
    """Mean batch shape of the engine steps between the two scrapes."""
    out = {}
    for name, what in BATCH_SHAPE.items():
        n = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        s = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        out[name] = {"what": what, "steps": int(n), "mean": round(s / n, 2) if n else None}
    return out
