"""A Python gRPC client for ``tulip.v1`` (tests, benchmarks, scripts).

Stubs are generated from ``proto/`` with grpcio-tools on first use and
cached by content hash, so they always match the .proto files they came from.
Needs the ``client`` extra (grpcio, grpcio-tools, protobuf).

Where grpcio-tools is missing, or its generated code would refuse an older
grpcio/protobuf (a GPU machine's image), the stubs are built at run time
from a serialized descriptor set instead (``TULIP_PROTO_DESCRIPTORS``, or
``gpu-bundle/protos.desc`` written by ``make gpu-bundle``): messages come from
protobuf's descriptor pool and the service stub from grpc's generic
``unary_unary``, so no version-checked generated code is imported.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
import tempfile
import types
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

PROTO_ROOT = Path(__file__).resolve().parents[1] / "proto"

KINDS = {"dense": 1, "sparse": 2, "multi_vector": 3, "score": 4, "classify": 5, "token_states": 6}
PRIORITIES = {"unspecified": 0, "interactive": 1, "batch": 2}


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(tempfile.gettempdir(), f"tulip-rose-{os.getuid()}")
    return Path(base) / "pyproto"


DESCRIPTORS_ENV = "TULIP_PROTO_DESCRIPTORS"
BUNDLED_DESCRIPTORS = PROTO_ROOT.parent / "gpu-bundle" / "protos.desc"


class StubError(RuntimeError):
    """The gRPC stubs cannot be generated or imported here."""


def load_stubs(package: str = "tulip") -> tuple[ModuleType, ModuleType]:
    """``(pb2, pb2_grpc)`` for ``proto/<package>/v1/<package>.proto``: from
    the descriptor set named by ``$TULIP_PROTO_DESCRIPTORS`` when set, else
    generated with grpcio-tools, else from ``gpu-bundle/protos.desc``."""
    named = os.environ.get(DESCRIPTORS_ENV)
    if named:
        return stubs_from_descriptors(Path(named), package)
    try:
        import grpc_tools  # noqa: F401
    except ImportError:
        if BUNDLED_DESCRIPTORS.is_file():
            return stubs_from_descriptors(BUNDLED_DESCRIPTORS, package)
        raise StubError("grpcio-tools is not installed and there is no descriptor set: install the `client` "
                        f"extra, or run `make gpu-bundle` / set {DESCRIPTORS_ENV}") from None
    try:
        return _generated(package)
    except ImportError as e:  # generated for a newer grpcio/protobuf than this one
        raise StubError(f"generated {package} stubs do not import here ({e}); use the descriptor set "
                        f"instead ({DESCRIPTORS_ENV}, written by `make gpu-bundle`)") from e


def _generated(package: str) -> tuple[ModuleType, ModuleType]:
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


def write_descriptors(out: Path, packages: tuple[str, ...] = ("tulip", "ivy")) -> Path:
    """Writes one serialized ``FileDescriptorSet`` of these packages' protos
    (with their imports) for ``stubs_from_descriptors``; needs grpcio-tools
    here, nothing but grpcio and protobuf where it is read."""
    from grpc_tools import protoc

    out.parent.mkdir(parents=True, exist_ok=True)
    srcs = [PROTO_ROOT / p / "v1" / f"{p}.proto" for p in packages]
    args = ["protoc", *(f"-I{s.parent}" for s in srcs), "--include_imports", f"--descriptor_set_out={out}"]
    rc = protoc.main([*args, *(str(s) for s in srcs)])
    if rc != 0:
        raise StubError(f"protoc failed writing {out} (exit {rc})")
    return out


def stubs_from_descriptors(path: Path, package: str = "tulip") -> tuple[ModuleType, ModuleType]:
    """``(pb2, pb2_grpc)`` look-alikes built from a descriptor set: message
    and enum values as attributes of the first, ``<Service>Stub`` classes in
    the second. Works with any protobuf >= 3.20 and any grpcio."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    if not path.is_file():
        raise StubError(f"descriptor set {path} is missing (run `make gpu-bundle`)")
    files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes()).file
    pool = descriptor_pool.DescriptorPool()
    for f in files:
        pool.Add(f)
    try:
        fd = pool.FindFileByName(f"{package}.proto")
    except KeyError:
        raise StubError(f"{path} has no {package}.proto") from None

    def message_class(desc):
        if hasattr(message_factory, "GetMessageClass"):  # protobuf >= 4.21
            return message_factory.GetMessageClass(desc)
        return message_factory.MessageFactory(pool).GetPrototype(desc)

    pb2 = types.ModuleType(f"{package}_pb2")
    for name, desc in fd.message_types_by_name.items():
        setattr(pb2, name, message_class(desc))
    for name, desc in fd.enum_types_by_name.items():
        setattr(pb2, name, desc)
        for v in desc.values:
            setattr(pb2, v.name, v.number)
    grpc_mod = types.ModuleType(f"{package}_pb2_grpc")
    for name, desc in fd.services_by_name.items():
        setattr(grpc_mod, f"{name}Stub", _stub_class(desc, message_class))
    return pb2, grpc_mod


def _stub_class(service, message_class):
    """A stub whose unary methods are the channel's generic callables."""
    methods = [(m.name, f"/{service.full_name}/{m.name}", message_class(m.input_type),
                message_class(m.output_type)) for m in service.methods]

    def __init__(self, channel):
        for name, path, req, resp in methods:
            setattr(self, name, channel.unary_unary(path, request_serializer=req.SerializeToString,
                                                    response_deserializer=resp.FromString))
    return type(f"{service.name}Stub", (), {"__init__": __init__})


def _ensure(p: Path) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    return p


@dataclass
class Output:
    """A decoded Embed response."""

    kind: str
    # dense, score: [n, dim]; multi_vector, token_states: list of
    # [rows_i, dim]; sparse:
    # list of dicts {token id: weight}.
    values: object
    tokens: int
    timing: dict[str, int]


class TulipClient:
    """Blocking client over one channel."""

    def __init__(self, target: str, timeout: float = 60.0):
        import grpc

        self.pb2, grpc_mod = load_stubs("tulip")
        opts: list[tuple[str, int | str]] = [("grpc.max_receive_message_length", 512 << 20),
                                             ("grpc.max_send_message_length", 512 << 20)]
        if target.startswith("unix:"):
            # grpc-core would send the socket path as :authority, which
            # Tulip's HTTP/2 server refuses as malformed.
            opts.append(("grpc.default_authority", "localhost"))
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
                dimensions: int = 0, raw_scores: bool = False, priority: str | int = "unspecified"):
        """The EmbedRequest message for these sequences (``priority`` by name,
        or a raw number to test what the server does with unknown values)."""
        req = self.pb2.EmbedRequest(
            token_ids=[t for s in sequences for t in s],
            lengths=[len(s) for s in sequences],
            kind=KINDS[kind],
            dimensions=dimensions,
            raw_scores=raw_scores,
            priority=PRIORITIES[priority] if isinstance(priority, str) else priority,
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
    values: np.ndarray | list  # one array, or one entry per sequence (Output.values)
    if kind in ("dense", "score", "classify"):
        values = data.reshape(resp.rows, resp.dim)
    elif kind in ("multi_vector", "token_states"):
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
