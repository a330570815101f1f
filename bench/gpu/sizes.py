"""The GPU run's sizes (the real ones, or tiny for the dry run) and the
CUDA graph configurations its charts need captured at start-up."""

from __future__ import annotations


class Sizes:
    """Request counts and lengths: the real ones, or tiny for the dry run."""

    def __init__(self, dry: bool):
        self.lengths = [16, 64, 128] if dry else [128, 512, 4096]
        self.sweep = [8, 32, 128] if dry else [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
        self.rounds = 5 if dry else 50
        self.sweep_rounds = 3 if dry else 20
        self.score_length = 64 if dry else 512
        self.score_batches = [5, 25, 50]
        self.score_rounds = 2 if dry else 15
        # The batch chart of bench/TARGETS.md: three lengths for BGE-M3, 512 for the rest.
        self.tput_lengths = {"bge-m3": [32] if dry else [512, 1024, 4096]}
        self.tput_default = [32] if dry else [512]
        self.tput_batch, self.tput_clients, self.tput_requests = (20, 2, 1) if dry else (100, 4, 2)
        self.conc_levels = [1, 2] if dry else [1, 2, 4, 8, 16]
        self.conc_length = 64 if dry else 512
        self.conc_per_level = 6 if dry else 64
        self.overlap = dict(length=16 if dry else 128, clients=2 if dry else 8, requests=4 if dry else 40,
                            rounds=1 if dry else 3)
        # The simulated device's cost model fitted here (bench/gpu/calibrate.py).
        self.calib_lengths = [16, 64] if dry else [64, 128, 256, 512, 1024, 2048, 4096]
        self.calib_counts = [1, 4] if dry else [1, 4, 16]
        self.calib_max_tokens = 256 if dry else 16384
        self.calib_rounds = 2 if dry else 10
        self.sweep_grid = "dry" if dry else "cuda"
        self.sweep_iters = 1 if dry else 10


def graph_configurations(sizes: Sizes, max_tokens: int = 8192, max_sequences: int = 64) -> dict[str, list[str]]:
    """The CUDA graph configurations each server's charts produce, as
    Tulip's ``--capture`` takes them, so every graph is captured at start-up
    and none inside a timed window. ``n x (n*L + 1)``: ``--capture`` pads
    ``tokens - 1`` real tokens, and n sequences of L tokens fall in the
    bucket of n*L real tokens."""
    def configs(pairs):
        return sorted({f"{n}x{n * length + 1}" for n, length in pairs
                       if n <= max_sequences and n * length + 1 < max_tokens})

    overlap = [(c, sizes.overlap["length"]) for c in range(1, sizes.overlap["clients"] + 1)]
    serving = [(1, n) for n in sizes.lengths]
    serving += [(b, sizes.score_length) for b in sizes.score_batches]
    serving += [(c, sizes.conc_length) for c in range(1, max(sizes.conc_levels) + 1)]
    # The serving Tulip is also overlap's "on" side (two steps in flight).
    return {"serving": configs(serving + overlap), "overlap-off": configs(overlap)}


def fitting(configs: list[str], max_length: int) -> list[str]:
    """The configurations whose capture batch (the bucket's tokens spread
    over its sequences) a model of ``max_length`` accepts."""
    from rose.step.graphs import GraphKey, GraphSettings

    settings, out = GraphSettings(), []
    for text in configs:
        key = GraphKey.parse(text)
        padded = settings.bucket(key.tokens - 1)
        if padded is not None and -(-(padded - 1) // key.sequences) <= max_length:
            out.append(text)
    return out
