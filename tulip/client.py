"""A Python gRPC client for ``tulip.v1`` (tests, benchmarks, scripts).

Stubs are generated from ``proto/`` with grpcio-tools on first use and
cached by content hash, so they always match the .proto files they came from.
Needs the ``client`` extra (grpcio, grpcio-tools, protobuf).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

PROTO_ROOT = Path(__file__).resolve().parents[1] / "proto"

KINDS = {"dense": 1, "sparse": 2, "multi_vector": 3, "score": 4}


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(tempfile.gettempdir(), f"tulip-rose-{os.getuid()}")
    return Path(base) / "pyproto"


def load_stubs(package: str = "tulip") -> tuple[ModuleType, ModuleType]:
    """``(pb2, pb2_grpc)`` for ``proto/<package>/v1/<package>.proto``."""
    src_dir = PROTO_ROOT / package / "v1"
    src = src_dir / f"{package}.proto"
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    out = _cache_dir() / f"{package}-{digest}"
    if not (out / f"{package}_pb2_grpc.py").is_file():
        from grpc_tools import protoc

        tmp = Path(tempfile.mkdtemp(dir=_ensure(out.parent)))
        # Module names are <package>_pb2: generating from the proto's own
        # folder keeps them from clashing with the Python package `tulip`.
        rc = protoc.main([
            "protoc", f"-I{src_dir}", f"--python_out={tmp}", f"--grpc_python_out={tmp}", str(src),
        ])
        if rc != 0:
            raise RuntimeError(f"protoc failed on {src} (exit {rc})")
        try:
            tmp.rename(out)
        except OSError:
            pass  # another process generated it first
    if str(out) not in sys.path:
        sys.path.insert(0, str(out))
    return importlib.import_module(f"{package}_pb2"), importlib.import_module(f"{package}_pb2_grpc")


def _ensure(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


@dataclass
class Output:
    """A decoded Embed response."""

    kind: str
    # dense, score: [n, dim]; multi_vector: list of [rows_i, dim]; sparse:
    # list of dicts {token id: weight}.
    values: object
    tokens: int
    timing: dict[str, int]


class TulipClient:
    """Blocking client over one channel."""

    def __init__(self, target: str, timeout: float = 60.0):
        import grpc

        self.pb2, grpc_mod = load_stubs("tulip")
        opts = [("grpc.max_receive_message_length", 512 << 20), ("grpc.max_send_message_length", 512 << 20)]
        self.channel = grpc.insecure_channel(target.removeprefix("http://"), options=opts)
        self.stub = grpc_mod.TulipStub(self.channel)
        self.timeout = timeout

    def close(self) -> None:
        self.channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def info(self):
        return self.stub.Info(self.pb2.InfoRequest(), timeout=self.timeout)

    def request(self, sequences: list[list[int]], kind: str = "dense", normalize: bool | None = None,
                dimensions: int = 0, raw_scores: bool = False):
        """The EmbedRequest message for these sequences."""
        req = self.pb2.EmbedRequest(
            token_ids=[t for s in sequences for t in s],
            lengths=[len(s) for s in sequences],
            kind=KINDS[kind],
            dimensions=dimensions,
            raw_scores=raw_scores,
        )
        if normalize is not None:
            req.normalize = normalize
        return req

    def embed_raw(self, sequences: list[list[int]], **kw):
        """The raw EmbedResponse."""
        return self.stub.Embed(self.request(sequences, **kw), timeout=self.timeout)

    def embed(self, sequences: list[list[int]], **kw) -> Output:
        return decode(self.embed_raw(sequences, **kw))


def decode(resp) -> Output:
    kind = {v: k for k, v in KINDS.items()}[resp.kind]
    data = np.frombuffer(resp.data, dtype="<f4")
    if kind in ("dense", "score"):
        values = data.reshape(resp.rows, resp.dim)
    elif kind == "multi_vector":
        values, start = [], 0
        for n in resp.row_counts:
            values.append(data[start * resp.dim:(start + n) * resp.dim].reshape(n, resp.dim))
            start += n
    else:
        values, start = [], 0
        for n in resp.row_counts:
            ids = resp.sparse_indices[start:start + n]
            values.append(dict(zip(ids, data[start:start + n].tolist())))
            start += n
    t = resp.timing
    return Output(kind, values, resp.tokens,
                  {"queue_us": t.queue_us, "inference_us": t.inference_us, "total_us": t.total_us})
