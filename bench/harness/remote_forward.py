"""A bare ``transformers`` forward in a child process, one call per line:
heavy work by another process between two timed calls, where the
benchmarks' in-process sides put it in the measuring process itself.

Run as ``python -m bench.harness.remote_forward MODEL_DIR THREADS``: it
prints ``ready``, then per line of space-separated token ids runs the
forward on them and prints ``done``."""

from __future__ import annotations

import subprocess
import sys


class RemoteForward:
    def __init__(self, model_dir: str, threads: int):
        self.proc = subprocess.Popen([sys.executable, "-m", "bench.harness.remote_forward", model_dir, str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.close()
            raise RuntimeError(f"the forward's child process did not start (said {line!r})")

    def __call__(self, ids: list[int]) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(" ".join(map(str, ids)) + "\n")
        self.proc.stdin.flush()
        if self.proc.stdout.readline().strip() != "done":
            raise RuntimeError("the forward's child process died")

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


def main() -> None:
    import torch

    from bench.baselines.inprocess import BareForward

    torch.set_num_threads(int(sys.argv[2]))
    bare = BareForward(sys.argv[1])
    print("ready", flush=True)
    for line in sys.stdin:
        bare.forward(bare.prepare([[int(x) for x in line.split()]]))
        print("done", flush=True)


if __name__ == "__main__":
    main()
