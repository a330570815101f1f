"""The GPU benchmark script (``python -m bench.gpu.run``) and its parts:
random-weight models of the benchmark shapes, the correctness gate and
micro-checks, and the timings."""
