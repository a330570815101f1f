"""Malformed and odd gRPC requests, sent as raw bytes through grpcio's
generic calls, against Tulip's ``tulip.v1`` and Ivy's ``ivy.v1`` services:
random bytes, valid messages cut short or with bits flipped, and valid
messages with random field values. Every answer must carry a defined status
code for what was sent, and the server must still answer a good request
afterwards (checked every ``probe_every`` calls and at the end)."""

from __future__ import annotations

import random
import time
from collections import Counter
from typing import Callable

import grpc

# Bytes that are not a valid message: the server's protobuf decoder refuses
# them. tonic answers INTERNAL "failed to decode Protobuf message" (as
# grpc-go does for an unmarshal error); any other INTERNAL is a finding.
DECODE_ERROR = "failed to decode"
# Well-formed messages with odd values: the caller's fault, or a limit.
WELL_FORMED_OK = {grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED,
                  grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.NOT_FOUND, grpc.StatusCode.OUT_OF_RANGE}


def _text(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.3:
        return "".join(chr(rng.choice([rng.randrange(32, 127), rng.randrange(0x80, 0x2FFF),
                                       rng.randrange(0x10000, 0x10FFFF)])) for _ in range(rng.randrange(0, 40)))
    if kind < 0.5:
        return ""
    if kind < 0.6:
        return "word " * rng.randrange(100, 2000)  # beyond the model's length
    return rng.choice(["hello world", "a query", "\x00\x01", "🙂" * 5, " ", "x"])


def _uint(rng: random.Random, bits: int = 32) -> int:
    return rng.choice([0, 1, 2, rng.randrange(0, 1 << 16), rng.randrange(0, 1 << bits), (1 << bits) - 1])


def _enum(rng: random.Random) -> int:
    """An enum value, defined or not (proto3 enums are open: any int32 decodes)."""
    return rng.choice([0, 1, 2, 3, rng.randrange(-(1 << 31), 1 << 31)])


def tulip_requests(pb2, vocab: int) -> dict[str, Callable[[random.Random], bytes]]:
    """Method → a builder of a well-formed request with random values."""
    def embed(rng):
        n = rng.randrange(0, 6)
        lengths = [rng.choice([0, 1, rng.randrange(1, 20), rng.randrange(1, 600)]) for _ in range(n)]
        total = sum(lengths) + rng.choice([0, 0, 0, -1, 1, 5])
        ids = [rng.randrange(0, vocab) if rng.random() < 0.9 else _uint(rng) for _ in range(max(total, 0))]
        msg = pb2.EmbedRequest(token_ids=ids, lengths=lengths, kind=_enum(rng),
                               dimensions=rng.choice([0, 0, 1, 16, 384, 385, _uint(rng)]),
                               raw_scores=rng.random() < 0.2, request_id=_text(rng)[:64],
                               priority=_enum(rng))
        if rng.random() < 0.5:
            msg.normalize = rng.random() < 0.5
        return msg.SerializeToString()

    return {"/tulip.v1.Tulip/Embed": embed,
            "/tulip.v1.Tulip/Info": lambda rng: pb2.InfoRequest().SerializeToString()}


def ivy_requests(pb2) -> dict[str, Callable[[random.Random], bytes]]:
    def embed(rng):
        msg = pb2.EmbedRequest(inputs=[_text(rng) for _ in range(rng.randrange(0, 5))],
                               truncate=rng.random() < 0.5, dimensions=rng.choice([0, 0, 8, 384, _uint(rng)]),
                               priority=_enum(rng))
        if rng.random() < 0.3:
            msg.prompt_name = _text(rng)
        if rng.random() < 0.3:
            msg.normalize = rng.random() < 0.5
        return msg.SerializeToString()

    def rerank(rng):
        return pb2.RerankRequest(query=_text(rng), texts=[_text(rng) for _ in range(rng.randrange(0, 4))],
                                 truncate=rng.random() < 0.5, raw_scores=rng.random() < 0.5,
                                 return_text=rng.random() < 0.5, priority=_enum(rng)).SerializeToString()

    def tokenize(rng):
        msg = pb2.TokenizeRequest(inputs=[_text(rng) for _ in range(rng.randrange(0, 4))])
        if rng.random() < 0.5:
            msg.add_special_tokens = rng.random() < 0.5
        if rng.random() < 0.3:
            msg.prompt_name = _text(rng)
        return msg.SerializeToString()

    return {"/ivy.v1.Ivy/Embed": embed, "/ivy.v1.Ivy/EmbedSparse": embed, "/ivy.v1.Ivy/EmbedAll": embed,
            "/ivy.v1.Ivy/Rerank": rerank, "/ivy.v1.Ivy/Tokenize": tokenize,
            "/ivy.v1.Ivy/Info": lambda rng: pb2.InfoRequest().SerializeToString()}


def mutate(rng: random.Random, valid: bytes) -> tuple[str, bytes]:
    """One malformed variant of a valid message: (how, bytes)."""
    choice = rng.random()
    if choice < 0.3 or not valid:
        return "random", rng.randbytes(rng.choice([1, 2, 5, rng.randrange(1, 64), rng.randrange(1, 4096)]))
    if choice < 0.65:
        return "truncated", valid[:rng.randrange(0, len(valid))]
    data = bytearray(valid)
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(len(data))
        data[i] ^= 1 << rng.randrange(8)
    return "bit-flipped", bytes(data)


def defined(how: str, code: grpc.StatusCode, details: str) -> bool:
    """Whether ``code`` is a right answer to a request made ``how``."""
    if how == "unknown method":
        return code == grpc.StatusCode.UNIMPLEMENTED
    if how == "random values":
        return code in WELL_FORMED_OK
    # A mutated message may still decode: then the values rules apply.
    return code in WELL_FORMED_OK or (code == grpc.StatusCode.INTERNAL and DECODE_ERROR in details)


def run(target: str, requests: dict[str, Callable[[random.Random], bytes]], calls: int,
        good: tuple[str, bytes], seed: int = 0, alive: Callable[[], bool] | None = None,
        probe_every: int = 100, timeout: float = 30.0) -> dict:
    """``calls`` fuzzed calls spread over ``requests``' methods, half
    well-formed with random values and half malformed. ``good`` is a method
    and a request that must keep succeeding. Returns counts and findings."""
    rng = random.Random(seed)
    codes: Counter = Counter()
    findings: list[dict] = []
    probes_failed = 0
    crashed = False
    methods = sorted(requests)
    started = time.monotonic()
    with grpc.insecure_channel(target, options=[("grpc.max_receive_message_length", 64 << 20)]) as channel:
        def call(method: str, payload: bytes) -> tuple[grpc.StatusCode, str]:
            fn = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            try:
                fn(payload, timeout=timeout)
                return grpc.StatusCode.OK, ""
            except grpc.RpcError as e:
                return e.code(), e.details() or ""

        def probe() -> bool:
            return call(*good)[0] == grpc.StatusCode.OK

        for i in range(calls):
            method = methods[i % len(methods)] if i % 7 else "/" + rng.choice(["tulip.v1.Tulip", "ivy.v1.Ivy",
                                                                               "x.y"]) + "/Nope"
            valid = requests[method](rng) if method in requests else b""
            if method not in requests:
                how, payload = "unknown method", valid
            elif rng.random() < 0.5:
                how, payload = "random values", valid
            else:
                how, payload = mutate(rng, valid)
            code, details = call(method, payload)
            codes[f"{how}: {code.name}"] += 1
            if not defined(how, code, details) and len(findings) < 30:
                findings.append({"method": method, "how": how, "code": code.name, "details": details[:300],
                                 "payload_hex": payload[:512].hex()})
            if (i + 1) % probe_every == 0:
                if alive is not None and not alive():
                    crashed = True
                    break
                probes_failed += not probe()
        final_ok = (alive is None or alive()) and probe()
    return {"calls": sum(codes.values()), "codes": dict(sorted(codes.items())), "findings": findings,
            "probes_failed": probes_failed, "crashed": crashed or not final_ok,
            "seconds": round(time.monotonic() - started, 1)}
