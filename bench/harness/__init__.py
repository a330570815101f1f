"""The machinery every benchmark uses: the stack of gated servers and in-process
baselines, client processes and the HTTP client, timing statistics, the
correctness gate, inputs, results files and plots, and the fixtures the
tests share (tiny seeded models, the data, an OTLP collector)."""
