"""The things a benchmark times, started on demand and gated before use:
Tulip and Ivy on the model, Infinity, and the in-process baselines. A
benchmark asks for what it needs; the CPU suite shares one Stack across
benchmarks so each server starts (and is gated) once."""

from __future__ import annotations

import base64
import tempfile
from pathlib import Path

import numpy as np

from bench.harness import gate, inputs
from bench.harness.baseline_servers import INFINITY_MODEL_NAME, Infinity, Unavailable, infinity_version
from bench.harness.httpclient import HttpClient
from tulip_rose_cli.launch import Ivy, Tulip, default_model_dir

IVY_PATH = "/v1/embeddings"


def gate_texts(model_dir: str, max_length: int) -> list[str]:
    """Mixed real inputs: short and long English lines, multilingual
    passages, and texts at and beyond the model's maximum length."""
    eng = inputs.english_lines()
    miracl = inputs.lines("calibration_miracl.txt")
    return [*eng[:12], *miracl[::40], inputs.text_of_tokens(model_dir, max_length),
            inputs.text_of_tokens(model_dir, max_length + 40, start=7)]


def http_embeddings(client: HttpClient, path: str, texts: list[str], model: str | None = None) -> np.ndarray:
    """POST an OpenAI-shaped embeddings request and return the vectors."""
    payload = {"input": texts}
    if model:
        payload["model"] = model
    status, body = client.post_json(path, payload)
    if status != 200:
        raise gate.GateFailed(f"HTTP {status}: {str(body)[:300]}")
    rows = sorted(body["data"], key=lambda d: d["index"])
    return np.array([_vector(r["embedding"]) for r in rows], dtype=np.float32)


def _over_http(port: int, path: str, texts: list[str], model: str | None = None) -> np.ndarray:
    with HttpClient("127.0.0.1", port) as c:
        return http_embeddings(c, path, texts, model)


def _vector(v) -> np.ndarray:
    if isinstance(v, str):
        return np.frombuffer(base64.b64decode(v), dtype="<f4")
    return np.asarray(v, dtype=np.float32)


class Stack:
    """Lazily started, gated components on one model directory."""

    def __init__(self, model_dir: str | None = None, threads: int = 2, log_dir: Path | None = None,
                 tulip_flags: dict | None = None):
        self.model_dir = model_dir or default_model_dir()
        self.threads = threads
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="bench-logs-"))
        # The CPU fast path and the bfloat16 twin as served by default,
        # built before any timing.
        self.tulip_flags = {"cpu_fast_path": "true", "cpu_bf16": "auto", "cpu_fast_path_warm": "true",
                            **(tulip_flags or {})}
        self.gates: list[dict] = []
        self._tulip = self._ivy = self._infinity = self._st = self._bare = self._ort = None
        self._variants: dict[str, tuple[Tulip, Ivy]] = {}  # another Tulip's flags: its Tulip and Ivy
        self._reference: dict[str, np.ndarray] = {}
        self._failed: dict[str, Exception] = {}

    # References first: every gate compares against sentence-transformers.

    def st(self):
        if self._st is None:
            import torch

            from bench.baselines.inprocess import SentenceTransformersBaseline

            torch.set_num_threads(self.threads)
            self._st = SentenceTransformersBaseline(self.model_dir)
        return self._st

    @property
    def max_length(self) -> int:
        return self.st().max_length

    def reference(self, texts: list[str]) -> np.ndarray:
        key = "\n".join(texts)
        if key not in self._reference:
            self._reference[key] = self.st().encode(texts)
        return self._reference[key]

    def _gate(self, name: str, embed) -> None:
        texts = gate_texts(self.model_dir, self.max_length)
        self.gates.append(gate.check(name, embed(texts), self.reference(texts),
                                     "sentence-transformers encode"))

    def _start(self, name: str, start, embed_fn):
        """Starts a component and gates it; a component that failed its gate
        (or could not start) is stopped and never handed out."""
        if name in self._failed:
            raise self._failed[name]
        try:
            component = start()
        except Exception as e:
            self._failed[name] = e
            raise
        try:
            self._gate(name, embed_fn(component))
        except Exception as e:
            self._failed[name] = e
            if hasattr(component, "stop"):
                component.stop()
            raise
        return component

    def bare(self):
        if self._bare is None:
            from bench.baselines.inprocess import BareForward

            self._bare = self._start(
                "transformers forward (in-process)", lambda: BareForward(self.model_dir),
                lambda bare: lambda texts: bare.embed([self.ids(t) for t in texts]))
        return self._bare

    def onnxruntime(self):
        """fastembed's runtime in-process (ONNX Runtime + tokenizers, the
        model exported at start), gated like every side."""
        if self._ort is None:
            import torch

            from bench.baselines.inprocess import OnnxRuntimeBaseline

            torch.set_num_threads(self.threads)
            self._ort = self._start(
                "onnxruntime (in-process, fastembed's way)",
                lambda: OnnxRuntimeBaseline(self.model_dir, self.threads, self.max_length, self.log_dir / "onnx"),
                lambda o: o.encode)
        return self._ort

    def onnxruntime_or_note(self, notes: list[str]):
        """The onnxruntime side, or None with the reason appended to ``notes``."""
        try:
            return self.onnxruntime()
        except (ImportError, gate.GateFailed, RuntimeError) as e:
            notes.append(f"onnxruntime not measured: {type(e).__name__}: {e}")
            return None

    def ids(self, text: str) -> list[int]:
        return inputs.ids(self.model_dir, text, self.max_length)

    def _grpc_embed(self, tulip: Tulip):
        def run(texts):
            with tulip.client() as c:
                return c.embed([self.ids(x) for x in texts]).values
        return run

    def tulip(self) -> Tulip:
        if self._tulip is None:
            self._tulip = self._start(
                "Tulip gRPC (pre-tokenized)",
                lambda: Tulip(self.model_dir, log_dir=self.log_dir, threads=self.threads, timeout=900,
                              **self.tulip_flags),
                self._grpc_embed)
        return self._tulip

    def gated_tulip(self, name: str, **flags) -> Tulip:
        """Another Tulip on the same model with other flags, gated like the
        first; the caller stops it."""
        return self._start(name, lambda: Tulip(self.model_dir, log_dir=self.log_dir, threads=self.threads,
                                               timeout=900, **{**self.tulip_flags, **flags}), self._grpc_embed)

    def ivy(self) -> Ivy:
        if self._ivy is None:
            tulip = self.tulip()
            self._ivy = self._start(
                "Ivy → Tulip (HTTP, text)", lambda: Ivy([tulip.url], self.model_dir, log_dir=self.log_dir),
                lambda ivy: lambda texts: _over_http(ivy.port, IVY_PATH, texts))
        return self._ivy

    def float32_ivy(self) -> Ivy:
        """A second Ivy → Tulip with the bfloat16 twin off (float32 only):
        what the twin adds, measured in the same run."""
        return self.variant("float32 (--cpu-bf16 false)", cpu_bf16="false")[1]

    def int8_stack(self) -> tuple[Tulip, Ivy]:
        """Ivy → Tulip with the CPU fast path's int8 copy on (forced, as
        --cpu-int8 true; the twin off, which would take the fast path's
        steps where the CPU has AMX): int8 where its gate passes, float32
        elsewhere."""
        return self.variant("int8 (--cpu-int8 true --cpu-bf16 false)", cpu_int8="true", cpu_bf16="false")

    def colocated(self) -> tuple[Tulip, Ivy]:
        """Ivy → Tulip over a Unix socket (Tulip frames on it, Ivy's
        default there), as docs/latency.md advises where both share a
        host; Tulip's flags the stack's."""
        return self.variant("co-located (Unix socket)", unix=True)

    def variant(self, name: str, unix: bool = False, **flags) -> tuple[Tulip, Ivy]:
        """Another Ivy → Tulip whose Tulip has these flags besides the
        stack's, each gated like the first; started once per name.
        ``unix``: Ivy reaches it over a Unix socket instead of TCP."""
        if name not in self._variants:
            sock = tempfile.mktemp(prefix="tulip-", suffix=".sock") if unix else None
            if sock:
                flags["unix_socket"] = sock
            tulip = self.gated_tulip(f"Tulip gRPC, {name}", **flags)
            target = f"unix://{sock}" if sock else tulip.url
            try:
                ivy = self._start(f"Ivy → Tulip {name} (HTTP, text)",
                                  lambda: Ivy([target], self.model_dir, log_dir=self.log_dir),
                                  lambda ivy: lambda texts: _over_http(ivy.port, IVY_PATH, texts))
            except Exception:
                tulip.stop()
                raise
            self._variants[name] = (tulip, ivy)
        return self._variants[name]

    def infinity(self) -> Infinity:
        """Raises ``Unavailable`` (with the reason) when it cannot run here."""
        if self._infinity is None:
            self._infinity = self._start(
                "Infinity (HTTP, text)",
                lambda: Infinity(self.model_dir, log_dir=self.log_dir, threads=self.threads),
                lambda inf: lambda texts: _over_http(inf.port, Infinity.PATH, texts, INFINITY_MODEL_NAME))
        return self._infinity

    def infinity_or_note(self, notes: list[str]):
        """Infinity, or None with the reason it cannot be measured appended
        to ``notes`` (the benchmark then reports our side without it)."""
        try:
            return self.infinity()
        except (Unavailable, gate.GateFailed, RuntimeError) as e:
            notes.append(f"Infinity not measured: {e}")
            return None

    def extra_versions(self) -> dict:
        return {"infinity-emb": infinity_version()} if self._infinity else {}

    def close(self) -> None:
        for proc in (self._ivy, self._infinity, self._tulip,
                     *(p for pair in self._variants.values() for p in reversed(pair))):
            if proc is not None:
                proc.stop()
        self._tulip = self._ivy = self._infinity = None
        self._variants = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
