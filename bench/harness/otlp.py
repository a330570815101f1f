"""A small OTLP/gRPC trace collector (``TraceService/Export`` on
``opentelemetry-proto``'s messages) for tests and benchmarks: in-process
(``Collector.start()``) or as its own process (``python -m bench.harness.otlp
PORT``, which only counts spans, so that parsing them does not share a
process with a benchmark's timing client)."""

from __future__ import annotations

import sys
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


class Collector(trace_service_pb2_grpc.TraceServiceServicer):
    """Keeps every exported span as a flat dict: ids in hex, the exporting
    process's ``service.name``, attributes as plain values."""

    def __init__(self):
        self.spans: list[dict] = []
        self.lock = threading.Lock()
        self.server = None
        self.endpoint = ""

    def start(self, port: int = 0) -> "Collector":
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        self.server.start()
        self.endpoint = f"http://127.0.0.1:{port}"
        return self

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop(0)

    def Export(self, request, context):
        with self.lock:
            for rs in request.resource_spans:
                resource = _attrs(rs.resource.attributes)
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.spans.append({
                            "service": resource.get("service.name"),
                            "name": s.name,
                            "trace_id": s.trace_id.hex(),
                            "span_id": s.span_id.hex(),
                            "parent": s.parent_span_id.hex(),
                            "start": s.start_time_unix_nano,
                            "end": s.end_time_unix_nano,
                            "attrs": _attrs(s.attributes),
                        })
        return trace_service_pb2.ExportTraceServiceResponse()

    def snapshot(self) -> list[dict]:
        with self.lock:
            return list(self.spans)


class Counter(trace_service_pb2_grpc.TraceServiceServicer):
    """Counts spans without decoding their attributes."""

    def __init__(self):
        self.count = 0

    def Export(self, request, context):
        self.count += sum(len(ss.spans) for rs in request.resource_spans for ss in rs.scope_spans)
        return trace_service_pb2.ExportTraceServiceResponse()


def _attrs(kvs) -> dict:
    out = {}
    for kv in kvs:
        kind = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, kind) if kind else None
    return out


if __name__ == "__main__":
    # python -m bench.harness.otlp PORT: serves until killed; prints the span count on SIGTERM.
    import signal

    counter = Counter()
    server = grpc.server(futures.ThreadPoolExecutor(2))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(counter, server)
    server.add_insecure_port(f"127.0.0.1:{sys.argv[1]}")
    server.start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    done.wait()
    print(f"spans {counter.count}", flush=True)
    server.stop(0)
