"""Serves a real ROSE engine (the null model) through Tulip, wrapped so that
a chosen token id makes ``step_arena`` fail the way a broken engine would: with an
exception that is not the engine's invalid-batch error. Used by
tests/tulip/test_errors.py to check how Tulip classifies engine failures.

usage: python -m tests.support.fault_engine MODEL_DIR PORT METRICS_PORT [MAX_BATCH_SEQUENCES]
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path

from rose import Engine
from rose.interface import Batch, InvalidBatchError

FAULT_TOKEN = 7  # a batch holding this id raises ValueError (a bug, not the caller's fault)
CRASH_TOKEN = 8  # ... RuntimeError
REFUSED_TOKEN = 9  # ... the engine's own invalid-batch error (the caller's fault)


class FaultyEngine:
    def __init__(self, engine: Engine):
        self.engine = engine
        self.info = engine.info

    def step_arena(self, arena, sequences, tokens, kind):
        ids = set(Batch.from_arena(bytes(arena), sequences, tokens, kind).numpy_field("ids").tolist())
        if FAULT_TOKEN in ids:
            raise ValueError("injected engine bug")
        if CRASH_TOKEN in ids:
            raise RuntimeError("injected engine crash")
        if REFUSED_TOKEN in ids:
            raise InvalidBatchError("injected refusal")
        return self.engine.step_arena(arena, sequences, tokens, kind)


def start(model_dir: Path, log_dir: Path, max_batch_sequences: int = 64):
    """This engine's Tulip in a process of its own, serving; returns
    (process, gRPC port, metrics port)."""
    import grpc

    from tests.support.servers import Process, free_port
    from tulip.client import TulipClient

    port, metrics_port = free_port(), free_port()
    proc = Process("tulip-faults", [sys.executable, "-m", "tests.support.fault_engine", str(model_dir), str(port),
                                    str(metrics_port), str(max_batch_sequences)],
                   {"PYTHONPATH": str(Path(__file__).resolve().parents[2])}, log_dir)

    def serving():
        try:
            with TulipClient(f"127.0.0.1:{port}", timeout=1.0) as c:
                c.info()
            return True
        except grpc.RpcError:
            return False

    try:
        proc.wait_until(serving, 60, "serving")
    except Exception:
        proc.stop()
        raise
    return proc, port, metrics_port


def main() -> None:
    model_dir, port, metrics_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    # 1: every step holds one sequence, so a refused sequence fails only
    # the requests holding it, never a neighbour in the same step.
    max_batch_sequences = int(sys.argv[4]) if len(sys.argv) > 4 else 64

    def _terminate(signum, frame):
        raise SystemExit(0)

    signal.signal(signal.SIGTERM, _terminate)
    from tulip import serve

    serve(FaultyEngine(Engine.from_dir(model_dir, device="cpu")), host="127.0.0.1", port=port,
          metrics_port=metrics_port, max_batch_tokens=4096, max_batch_sequences=max_batch_sequences)


if __name__ == "__main__":
    main()
