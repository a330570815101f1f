"""Benchmarks for Ivy → Tulip → ROSE, each measured side by side with a
baseline in the same run, behind a correctness gate. ``python -m bench
--help`` lists the commands; ``bench/README.md`` says how to reproduce each
table."""
